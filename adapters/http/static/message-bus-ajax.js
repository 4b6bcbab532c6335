/* shmbus: an XMLHttpRequest transport for the npm `message-bus-client` (load it right after message-bus.js).
 *
 * The npm package ships only assets/message-bus.js, which needs jQuery.ajax or an adapter in MessageBus.ajax.
 * This is the adapter, written from the behaviour of the gem's message-bus-ajax.js, with one fix: an
 * aborted request reports textStatus "abort" (the core then retries after minPollInterval instead of counting
 * a failure and backing off). Served by shmbus's middleware at <base_route>message-bus/assets/: loaded from
 * there, it sets MessageBus.baseUrl to <base_route> (set MessageBus.baseUrl after loading it to override).
 * MIT License (shmbus).
 */
(function (global) {
  "use strict";
  if (!global.MessageBus) {
    throw new Error("message-bus-ajax.js: load message-bus.js first");
  }
  var script = global.document && global.document.currentScript;
  var served = script && script.src && /^(.*\/)message-bus\/assets\/message-bus-ajax\.js(?:[?#].*)?$/.exec(script.src);
  if (served) {
    global.MessageBus.baseUrl = served[1];
  }
  global.MessageBus.ajax = function (options) {
    var Impl = global.MessageBus.xhrImplementation || global.XMLHttpRequest;
    var xhr = new Impl();
    var aborted = false;
    var realAbort = xhr.abort;
    xhr.abort = function () {
      aborted = true;
      return realAbort.apply(xhr, arguments);
    };
    xhr.dataType = options.dataType;
    xhr.open("POST", options.url);
    var headers = options.headers || {};
    for (var name in headers) {
      xhr.setRequestHeader(name, headers[name]);
    }
    xhr.setRequestHeader("Content-Type", "application/x-www-form-urlencoded");
    if (options.messageBus && options.messageBus.chunked) {
      options.messageBus.onProgressListener(xhr);
    }
    xhr.onreadystatechange = function () {
      if (xhr.readyState !== 4) return;
      var status = xhr.status;
      if (!aborted && ((status >= 200 && status < 300) || status === 304)) {
        options.success(xhr.responseText);
      } else {
        options.error(xhr, aborted ? "abort" : xhr.statusText);
      }
      options.complete();
    };
    xhr.send(new URLSearchParams(options.data).toString());
    return xhr;
  };
})(typeof self !== "undefined" ? self : this);
