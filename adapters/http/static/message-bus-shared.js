/* shmbus: one message_bus connection per browser, shared by all tabs of an origin.
 *
 * Load it instead of (or after) message-bus.js + message-bus-ajax.js; it keeps the npm client's API
 * (MessageBus.subscribe, unsubscribe, start, stop, status(), baseUrl, callbackInterval, headers, clientId).
 * One hub polls for the union of every tab's channels and hands each message to the tabs that subscribed:
 *   - "worker": a SharedWorker (this same file) holds the hub;
 *   - "leader": no SharedWorker (Chrome on Android): the tab holding a Web Lock holds the hub and talks to the
 *     other tabs over a BroadcastChannel; when it closes, the lock passes to another tab, which resumes from the
 *     last ids each tab reports (each tab keeps its own, and drops what it has already seen);
 *   - "plain": neither: the npm client if it was loaded first, else this file's own poll, one per tab.
 * Every tab of a browser shares one client id (MessageBus.clientId). Docs: docs/shared-worker.md.
 * MIT License (shmbus).
 */
(function (global) {
  "use strict";

  var SEPARATOR = "\r\n|\r\n";
  var ESCAPED = /\r\n\|\|\r\n/g;
  var MIN_POLL_INTERVAL = 100; // ms between the starts of two polls, as the npm client's minPollInterval

  function uniqueId() {
    var a = new Uint8Array(16);
    global.crypto.getRandomValues(a);
    var s = "";
    for (var i = 0; i < a.length; i++) s += (a[i] + 256).toString(16).slice(1);
    return s;
  }

  /* Where a set of callbacks stands on each channel: the lowest id any of them has seen (>= 0), else the
   * deepest look-back (< -1), else -1 (new messages only). What a poll must ask for to serve all of them. */
  function lowest(positions) {
    var seen = null;
    var back = null;
    for (var i = 0; i < positions.length; i++) {
      var p = positions[i];
      if (p >= 0) seen = seen === null ? p : Math.min(seen, p);
      else if (p < -1) back = back === null ? p : Math.min(back, p);
    }
    return seen !== null ? seen : back !== null ? back : -1;
  }

  // ------------------------------------------------------------------------------------------------ the hub
  /* The one poll of a browser. Tabs attach with a send function; hub.update(tab, channels, config) says what a
   * tab wants (channel -> last id it has seen); the hub sends each tab {t: "msgs"} / {t: "status"} for its
   * channels only, never a message the tab already had, and restarts the poll when the union changes. */
  function Hub(clientId) {
    this.clientId = clientId;
    this.tabs = {}; // tab id -> {send, channels: {channel: last id}}
    this.config = { baseUrl: "/", callbackInterval: 15000, headers: {}, enableLongPolling: true, enableChunkedEncoding: true };
    this.handed = {}; // channel -> last id the poll has covered
    this.seq = 0;
    this.polls = 0;
    this.failCount = 0;
    this.controller = null;
    this.asked = null; // the channels the poll in flight asked for
    this.timer = null;
    this.queued = false;
    this.stopped = false;
  }

  Hub.prototype.attach = function (tab, send) {
    if (!this.tabs[tab]) this.tabs[tab] = { send: send, channels: {} };
    else this.tabs[tab].send = send;
  };

  Hub.prototype.detach = function (tab) {
    if (!this.tabs[tab]) return;
    delete this.tabs[tab];
    if (!this.covers()) this.restart();
  };

  Hub.prototype.update = function (tab, channels, config) {
    var t = this.tabs[tab];
    if (!t) return;
    if (config) for (var k in config) this.config[k] = config[k];
    var resolved = {};
    var any = false;
    for (var ch in channels) {
      // a tab new to a channel the poll already follows: "new messages only" means from here
      if (channels[ch] === -1 && this.handed[ch] !== undefined) {
        channels[ch] = this.handed[ch];
        resolved[ch] = this.handed[ch];
        any = true;
      }
    }
    t.channels = channels;
    if (any) t.send({ t: "status", data: resolved, resolve: true });
    if (this.covers()) return;
    this.restart();
  };

  /* Whether the poll in flight already serves every tab: the same channels, none wanting older messages. */
  Hub.prototype.covers = function () {
    var asked = this.asked;
    if (!this.controller || !asked) return false;
    var want = this.request() || {};
    var n = 0;
    for (var ch in want) {
      n++;
      if (asked[ch] === undefined) return false;
      if (this.handed[ch] === undefined) {
        if (want[ch] !== -1 && want[ch] !== asked[ch]) return false;
      } else if (want[ch] !== -1 && want[ch] < this.handed[ch]) return false;
    }
    return n === Object.keys(asked).length;
  };

  Hub.prototype.request = function () {
    var byChannel = {};
    for (var tab in this.tabs) {
      var chs = this.tabs[tab].channels;
      for (var ch in chs) (byChannel[ch] = byChannel[ch] || []).push(chs[ch]);
    }
    var out = {};
    var n = 0;
    for (var c in byChannel) {
      out[c] = lowest(byChannel[c]);
      n++;
    }
    return n ? out : null;
  };

  /* Abort the poll in flight and start the next one soon (coalescing a burst of tab updates). */
  Hub.prototype.restart = function () {
    if (this.stopped) return;
    if (this.controller) {
      this.controller.abort();
      this.controller = null;
    }
    this.schedule(0);
  };

  /* The next poll: at once (a microtask, so a burst of updates makes one poll, and no timer a hidden leader
   * tab's throttling could hold back), or after ``delay`` ms (backing off, or polling without long polls). */
  Hub.prototype.schedule = function (delay) {
    var me = this;
    if (me.timer !== null) clearTimeout(me.timer);
    me.timer = null;
    if (delay) {
      me.timer = setTimeout(function () {
        me.timer = null;
        me.poll();
      }, delay);
    } else if (!me.queued) {
      me.queued = true;
      Promise.resolve().then(function () {
        me.queued = false;
        me.poll();
      });
    }
  };

  Hub.prototype.stop = function () {
    this.stopped = true;
    if (this.timer !== null) clearTimeout(this.timer);
    if (this.controller) this.controller.abort();
    this.controller = null;
  };

  Hub.prototype.deliver = function (messages) {
    var status = null;
    for (var i = 0; i < messages.length; i++) {
      var m = messages[i];
      if (m.channel === "/__status") {
        status = status || {};
        for (var sc in m.data) status[sc] = m.data[sc];
        continue;
      }
      this.handed[m.channel] = m.message_id;
    }
    for (var tab in this.tabs) {
      var t = this.tabs[tab];
      var mine = [];
      for (var j = 0; j < messages.length; j++) {
        var msg = messages[j];
        if (msg.channel === "/__status") continue;
        var at = t.channels[msg.channel];
        if (at === undefined || (at >= 0 && msg.message_id <= at)) continue;
        t.channels[msg.channel] = msg.message_id;
        mine.push(msg);
      }
      var st = null;
      if (status) {
        for (var c in status) {
          if (t.channels[c] === undefined) continue;
          t.channels[c] = status[c];
          (st = st || {})[c] = status[c];
        }
      }
      if (mine.length) t.send({ t: "msgs", msgs: mine });
      if (st) t.send({ t: "status", data: st });
    }
    if (status) for (var s in status) this.handed[s] = status[s];
  };

  Hub.prototype.poll = function () {
    var me = this;
    if (me.stopped || me.controller) return;
    var channels = me.request();
    if (!channels) return;
    var cfg = me.config;
    var body = [];
    for (var ch in channels) body.push(encodeURIComponent(ch) + "=" + encodeURIComponent(channels[ch]));
    body.push("__seq=" + me.seq++);
    var headers = { "Content-Type": "application/x-www-form-urlencoded" };
    for (var h in cfg.headers || {}) headers[h] = cfg.headers[h];
    var chunked = cfg.enableLongPolling && cfg.enableChunkedEncoding;
    if (!chunked) headers["Dont-Chunk"] = "true";
    var url = cfg.baseUrl + "message-bus/" + me.clientId + "/poll" + (cfg.enableLongPolling ? "" : "?dlp=t");
    var controller = new AbortController();
    me.controller = controller;
    me.asked = channels;
    me.polls++;
    var began = Date.now();
    var buffer = "";
    var decoder = new TextDecoder();
    var consume = function (final) {
      var parts = buffer.split(SEPARATOR);
      buffer = final ? "" : parts.pop();
      for (var i = 0; i < parts.length; i++) {
        var piece = parts[i].replace(ESCAPED, SEPARATOR);
        if (piece.trim()) me.deliver(JSON.parse(piece));
      }
    };
    var done = function (err, retryAfter) {
      if (me.controller !== controller) return; // aborted for a restart: that one schedules the next poll
      me.controller = null;
      if (err) {
        me.failCount++;
        me.schedule(retryAfter || Math.min(cfg.callbackInterval, 100 * Math.pow(2, me.failCount)));
      } else {
        me.failCount = 0;
        // a long poll answered at once (a server that cannot park, a newer poll of this client id): not a loop
        var quick = MIN_POLL_INTERVAL - (Date.now() - began);
        me.schedule(cfg.enableLongPolling ? Math.max(0, quick) : cfg.callbackInterval);
      }
    };
    fetch(url, { method: "POST", headers: headers, body: body.join("&"), signal: controller.signal, cache: "no-store" })
      .then(function (resp) {
        if (resp.status === 429) {
          var after = parseInt(resp.headers.get("Retry-After") || "0", 10);
          return done(new Error("429"), Math.max(after * 1000, 100));
        }
        if (!resp.ok) return done(new Error("HTTP " + resp.status));
        if (!chunked || !resp.body) {
          return resp.text().then(function (text) {
            if (me.controller !== controller) return;
            if (chunked) {
              buffer = text;
              consume(true);
            } else if (text.trim()) me.deliver(JSON.parse(text));
            done(null);
          });
        }
        var reader = resp.body.getReader();
        var step = function () {
          return reader.read().then(function (r) {
            if (me.controller !== controller) return reader.cancel();
            if (r.done) {
              buffer += decoder.decode();
              consume(true);
              return done(null);
            }
            buffer += decoder.decode(r.value, { stream: true });
            consume(false);
            return step();
          });
        };
        return step();
      })
      .catch(function (err) {
        done(err && err.name === "AbortError" ? null : err || new Error("poll failed"));
      });
  };

  // ------------------------------------------------------------------------------------------ inside a worker
  if (typeof global.SharedWorkerGlobalScope !== "undefined" && global instanceof global.SharedWorkerGlobalScope) {
    var hub = null;
    global.onconnect = function (event) {
      var port = event.ports[0];
      var tab = null;
      port.onmessage = function (e) {
        var d = e.data;
        if (d.t === "hello") {
          if (!hub) hub = new Hub(d.clientId);
          tab = d.tab;
          hub.attach(tab, function (msg) {
            port.postMessage(msg);
          });
          port.postMessage({ t: "hello", clientId: hub.clientId });
          // the tab holds a lock named after it while it lives: granted to us when it is gone
          if (global.navigator.locks) {
            global.navigator.locks.request("shmbus-tab:" + tab, function () {
              hub.detach(tab);
            });
          }
        } else if (d.t === "subs" && hub && tab) hub.update(tab, d.channels, d.config);
        else if (d.t === "bye" && hub && tab) hub.detach(tab);
        else if (d.t === "restart" && hub) hub.restart();
        else if (d.t === "info" && hub) port.postMessage({ t: "info", id: d.id, polls: hub.polls, tabs: Object.keys(hub.tabs).length });
      };
      port.start();
    };
    return;
  }

  // ------------------------------------------------------------------------------------------------ in a page
  var previous = global.MessageBus;
  var doc = global.document;
  var script = doc && doc.currentScript;
  var scriptUrl = script && script.src;
  var served = scriptUrl && /^(.*\/)message-bus\/assets\/message-bus-shared\.js(?:[?#].*)?$/.exec(scriptUrl);
  var hasWorker = typeof global.SharedWorker === "function" && !!scriptUrl;
  var hasLeader = !!(global.navigator && global.navigator.locks && typeof global.BroadcastChannel === "function");

  if (!hasWorker && !hasLeader && previous && typeof previous.subscribe === "function") {
    previous.transport = "plain"; // the npm client as loaded: one poll per tab
    return;
  }

  var transport = hasWorker ? "worker" : hasLeader ? "leader" : "plain";
  var tabId = uniqueId();
  var callbacks = [];
  var started = false;
  var stopped = false;
  var link = null; // {send(msg)} to the hub, once connected

  function storedClientId() {
    try {
      var key = "shmbus-client-id";
      var id = global.localStorage.getItem(key);
      if (!id) {
        id = uniqueId();
        global.localStorage.setItem(key, id);
      }
      return id;
    } catch (e) {
      return uniqueId();
    }
  }

  var me = {
    transport: transport,
    leading: false,
    clientId: transport === "plain" ? uniqueId() : storedClientId(),
    baseUrl: served ? served[1] : previous && previous.baseUrl ? previous.baseUrl : "/",
    callbackInterval: previous && previous.callbackInterval ? previous.callbackInterval : 15000,
    enableLongPolling: true,
    enableChunkedEncoding: true,
    headers: (previous && previous.headers) || {},

    status: function () {
      return started ? "started" : "stopped";
    },

    start: function () {
      if (started) return;
      started = true;
      stopped = false;
      connect();
      sendSubs();
    },

    stop: function () {
      started = false;
      stopped = true;
      if (link) link.send({ t: "subs", channels: {} });
    },

    /* Start the shared poll again now: its next request carries the cookies of this moment (after a login or
     * a logout in this tab, every tab's deliveries follow the new identity at once). */
    restartPoll: function () {
      if (link) link.send({ t: "restart" });
    },

    subscribe: function (channel, func, lastId) {
      if (!started && !stopped) me.start();
      if (lastId === null || typeof lastId === "undefined") lastId = -1;
      else if (typeof lastId !== "number") throw "lastId has type " + typeof lastId + " but a number was expected.";
      if (typeof channel !== "string") throw "Channel name must be a string!";
      callbacks.push({ channel: channel, func: func, last_id: lastId });
      sendSubs();
      return func;
    },

    unsubscribe: function (channel, func) {
      var glob = channel.charAt(channel.length - 1) === "*";
      if (glob) channel = channel.slice(0, -1);
      var removed = false;
      for (var i = callbacks.length - 1; i >= 0; i--) {
        var cb = callbacks[i];
        var hit = glob ? cb.channel.slice(0, channel.length) === channel : cb.channel === channel;
        if (hit && (!func || cb.func === func)) {
          callbacks.splice(i, 1);
          removed = true;
        }
      }
      if (removed) sendSubs();
      return removed;
    },
  };

  function positions() {
    var by = {};
    for (var i = 0; i < callbacks.length; i++) (by[callbacks[i].channel] = by[callbacks[i].channel] || []).push(callbacks[i].last_id);
    var out = {};
    for (var ch in by) out[ch] = lowest(by[ch]);
    return out;
  }

  function config() {
    return {
      baseUrl: me.baseUrl,
      callbackInterval: me.callbackInterval,
      headers: me.headers,
      enableLongPolling: me.enableLongPolling,
      enableChunkedEncoding: me.enableChunkedEncoding,
    };
  }

  var pending = false;
  function sendSubs() {
    if (!link || !started || pending) return;
    pending = true; // one update per burst of subscribe/unsubscribe calls
    Promise.resolve().then(function () {
      pending = false;
      if (link && started) link.send({ t: "subs", channels: positions(), config: config() });
    });
  }

  /* From the hub: messages (each callback runs once per message id, in order) and positions. */
  function receive(d) {
    if (d.t === "hello") {
      me.clientId = d.clientId;
    } else if (d.t === "msgs") {
      if (!started) return;
      for (var i = 0; i < d.msgs.length; i++) {
        var m = d.msgs[i];
        for (var j = 0; j < callbacks.length; j++) {
          var cb = callbacks[j];
          if (cb.channel !== m.channel || (cb.last_id >= 0 && m.message_id <= cb.last_id)) continue;
          cb.last_id = m.message_id;
          try {
            cb.func(m.data, m.global_id, m.message_id);
          } catch (e) {
            if (global.console) global.console.log("MESSAGE BUS FAIL: callback " + cb.channel + " caused exception " + (e && e.stack));
          }
        }
      }
    } else if (d.t === "status") {
      for (var k = 0; k < callbacks.length; k++) {
        var c = callbacks[k];
        var v = d.data[c.channel];
        if (v !== undefined && (!d.resolve || c.last_id === -1)) c.last_id = v;
      }
    } else if (d.t === "leader") {
      // a new leader: tell it where this tab stands (it resumes from what each tab has seen)
      link.send({ t: "hello" });
      if (started) link.send({ t: "subs", channels: positions(), config: config() });
    }
  }

  // a page leaving for the back/forward cache said "bye": coming back, it attaches again
  if (global.addEventListener) {
    global.addEventListener("pageshow", function (e) {
      if (!e.persisted || !link) return;
      link.send(transport === "worker" ? { t: "hello", tab: tabId, clientId: me.clientId } : { t: "hello" });
      if (started) link.send({ t: "subs", channels: positions(), config: config() });
    });
  }

  // this tab's lock, held while it lives: whoever holds the hub learns of its end when granted the same lock
  if (global.navigator && global.navigator.locks) {
    global.navigator.locks.request("shmbus-tab:" + tabId, function () {
      return new Promise(function () {});
    });
  }

  function connect() {
    if (link) return;
    if (transport === "worker") {
      var worker = new global.SharedWorker(scriptUrl, { name: "shmbus " + new URL(me.baseUrl, global.location.href).href });
      var port = worker.port;
      port.onmessage = function (e) {
        receive(e.data);
      };
      port.start();
      link = {
        send: function (msg) {
          port.postMessage(msg);
        },
      };
      port.postMessage({ t: "hello", tab: tabId, clientId: me.clientId });
      global.addEventListener("pagehide", function () {
        port.postMessage({ t: "bye" });
      });
    } else if (transport === "leader") {
      connectLeader();
    } else {
      var local = new Hub(me.clientId);
      local.attach(tabId, receive);
      link = {
        send: function (msg) {
          if (msg.t === "subs") local.update(tabId, msg.channels, msg.config);
          else if (msg.t === "restart") local.restart();
        },
      };
    }
  }

  function connectLeader() {
    var name = "shmbus " + new URL(me.baseUrl, global.location.href).href;
    var bc = new global.BroadcastChannel(name);
    var hub = null;
    var fromTab = function (d) {
      if (d.t === "hello") {
        hub.attach(d.tab, function (msg) {
          msg.to = d.tab;
          bc.postMessage(msg);
        });
        bc.postMessage({ t: "hello", to: d.tab, clientId: hub.clientId });
        global.navigator.locks.request("shmbus-tab:" + d.tab, function () {
          hub.detach(d.tab);
        });
      } else if (d.t === "subs") hub.update(d.tab, d.channels, d.config);
      else if (d.t === "bye") hub.detach(d.tab);
      else if (d.t === "restart") hub.restart();
    };
    bc.onmessage = function (e) {
      var d = e.data;
      if (d.to !== undefined) {
        if (d.to === tabId) receive(d);
        else if (d.to === "*") receive(d);
      } else if (hub && d.from !== tabId) fromTab(d);
    };
    link = {
      send: function (msg) {
        msg.tab = tabId;
        msg.from = tabId;
        if (hub) fromTab(msg);
        else bc.postMessage(msg);
      },
    };
    bc.postMessage({ t: "hello", tab: tabId, from: tabId });
    global.addEventListener("pagehide", function () {
      if (!hub) bc.postMessage({ t: "bye", tab: tabId, from: tabId });
    });
    global.navigator.locks.request(name, function () {
      // the lock is ours until this tab closes: hold the hub, resuming from what every tab reports
      me.leading = true;
      me.leadingSince = Date.now();
      hub = new Hub(me.clientId);
      hub.attach(tabId, receive);
      if (started) hub.update(tabId, positions(), config());
      bc.postMessage({ t: "leader", to: "*" });
      bc.postMessage({ t: "hello", to: "*", clientId: hub.clientId });
      return new Promise(function () {});
    });
  }

  global.MessageBus = me;
})(typeof self !== "undefined" ? self : this);
