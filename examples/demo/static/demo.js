/* The demo page: subscribes with the npm message-bus-client (message-bus.js + our ajax adapter). */
(function () {
  "use strict";
  var MB = window.MessageBus;
  var $ = function (id) { return document.getElementById(id); };
  var PAGES = ["/", "/pricing", "/docs", "/blog", "/signup", "/about"];
  var myPids = {};
  var workers = {};
  var clicks = {};

  MB.baseUrl = "/";
  $("client-id").textContent = MB.clientId;
  $("user").value = localStorage.getItem("shmbus-demo-user") || "guest" + Math.floor(Math.random() * 1000);

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function time(ts) { return new Date(ts * 1000).toLocaleTimeString(); }

  // ?report=N: log the first N chat messages to the console ("SHMBUS:" lines, then "SHMBUS:DONE"), which is
  // what the automated browser test (tests/e2e/test_demo.py) reads. Nothing changes for a person.
  var report = /[?&]report=(\d+)/.exec(location.search), reported = 0;
  var pushAvailable = false;  // set once GET /push/key answers (the server has the push extra)

  // Chat: the last 20 messages first (lastId -21 = look-behind), then live.
  MB.subscribe("/chat", function (m, globalId, messageId) {
    if (report && reported < +report[1]) {
      console.log("SHMBUS:" + JSON.stringify({ id: messageId, pid: m.pid, text: m.text, notify: pushAvailable }));
      if (++reported === +report[1]) console.log("SHMBUS:DONE");
    }
    var li = el("li", m.user === $("user").value ? "mine" : "");
    li.appendChild(el("span", "", time(m.at) + " "));
    li.appendChild(el("b", "", m.user + ": "));
    li.appendChild(el("span", "", m.text + " "));
    li.appendChild(el("span", "pid", "published by worker " + m.pid));
    if (pushAvailable) {  // "notify me": push the next chat messages to this browser, even with the page closed
      var bell = el("a", "notify", " notify me");
      bell.href = "#";
      bell.addEventListener("click", function (ev) { ev.preventDefault(); notifyMe(); });
      li.appendChild(bell);
    }
    li.title = "message id " + messageId + ", global id " + globalId;
    $("chat").appendChild(li);
    $("chat").scrollTop = $("chat").scrollHeight;
    $("conn").textContent = "live"; $("conn").className = "ok";
  }, -21);

  MB.subscribe("/dashboard/workers", function (w) {
    workers[w.pid] = w;
    renderWorkers();
    $("conn").textContent = "live"; $("conn").className = "ok";
  }, -11);

  // Fed by the Spark example pipeline: {"page", "clicks", "users"} per page; 0 = the whole backlog (latest wins).
  MB.subscribe("/dashboard/clicks", function (c) {
    clicks[c.page] = c;
    renderClicks();
  }, 0);

  function renderWorkers() {
    var tbody = $("workers").querySelector("tbody");
    tbody.textContent = "";
    var now = Date.now() / 1000;
    Object.keys(workers).sort().forEach(function (pid) {
      var w = workers[pid];
      if (now - w.at > 30) { delete workers[pid]; return; }  // a worker that stopped reporting
      var tr = el("tr");
      [pid, w.requests, w.chats, w.clicks, w.parked, w.streams || 0, time(w.at)].forEach(function (v, i) {
        tr.appendChild(el("td", i === 0 ? "pid" : "", String(v)));
      });
      tbody.appendChild(tr);
    });
  }

  function renderClicks() {
    var tbody = $("clicks").querySelector("tbody");
    tbody.textContent = "";
    Object.keys(clicks).map(function (k) { return clicks[k]; })
      .sort(function (a, b) { return b.clicks - a.clicks; })
      .forEach(function (c) {
        var tr = el("tr");
        [c.page, c.clicks, c.users === undefined ? "" : c.users].forEach(function (v) {
          tr.appendChild(el("td", "", String(v)));
        });
        tbody.appendChild(tr);
      });
  }

  function post(url, body) {
    return fetch(url, { method: "POST", headers: { "Content-Type": "application/json" },
                        body: JSON.stringify(body) }).then(function (r) {
      if (!r.ok) throw new Error(url + ": HTTP " + r.status);
      return r.json();
    });
  }

  $("chat-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    var text = $("text").value.trim();
    if (!text) return;
    localStorage.setItem("shmbus-demo-user", $("user").value);
    post("/chat", { user: $("user").value, text: text }).then(function (r) {
      myPids[r.pid] = true;
      $("last-post").textContent = "your last message was published by worker " + r.pid +
        " (id " + r.id + "); workers that published yours so far: " + Object.keys(myPids).join(", ");
      $("text").value = "";
    }).catch(function (e) { $("last-post").textContent = String(e); });
  });

  // "notify me": Web Push of new chat messages to this browser, as the chat name typed above (the demo has no
  // login). Offered only when the server has the push extra (GET /push/key answers) and the browser can.
  // A browser subscribes only through its vendor's push service (Chrome: Google's FCM). Offline, or in a build
  // without it, Chromium's pushManager.subscribe() never settles (no error, no timeout of its own): so the page
  // waits SUBSCRIBE_WAIT for it, then says so, and uses the development push service if the demo has one.
  var SUBSCRIBE_WAIT = 10000;  // ms; Chrome answers within a second or two when its push service is reachable
  var DEV_HOWTO = "To try notifications without one, run the development push service (.venv/bin/shmbus push-dev) " +
    "and start the demo with scripts/demo --push-dev http://127.0.0.1:8030 (docs/push.md).";
  var myDevice = null;  // SHA-256 of the registered endpoint, first 16 hex digits: what /demo/push-status names
  var myService = "";  // where that device's pushes go: "this browser's push service" or the development one

  function notifyStatus(text) { $("notify-status").textContent = text; }

  function base64ToBytes(b64) {
    var raw = atob(b64.replace(/-/g, "+").replace(/_/g, "/") + "==".slice(0, (4 - b64.length % 4) % 4));
    return Uint8Array.from(raw, function (c) { return c.charCodeAt(0); });
  }

  function deviceId(endpoint) {
    return crypto.subtle.digest("SHA-256", new TextEncoder().encode(endpoint)).then(function (hash) {
      return Array.from(new Uint8Array(hash).slice(0, 8), function (b) {
        return ("0" + b.toString(16)).slice(-2);
      }).join("");
    });
  }

  function register(subscription, user, service, how) {
    return fetch("/push/subscriptions", {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Demo-User": user },
      body: JSON.stringify({ subscription: subscription, topics: ["/chat"] }),
    }).then(function (r) {
      if (!r.ok) {
        return r.text().then(function (t) { throw new Error("/push/subscriptions: HTTP " + r.status + " " + t); });
      }
      return deviceId(subscription.endpoint).then(function (id) {
        myDevice = id;
        myService = service;
        notifyStatus("notifications on for new chat messages (as " + user + ")" + how);
      });
    });
  }

  // The browser's push service did not answer (or refused): say so now, then fall back to the dev push service.
  function noPushService(why, user) {
    return fetch("/push-dev").then(function (r) { return r.ok ? r.json() : null; }).then(function (dev) {
      if (!dev) {
        notifyStatus("No push service reachable: this browser's push service " + why + ". Browsers deliver " +
          "notifications only through it (Chrome: Google's FCM), so none can arrive here. " + DEV_HOWTO);
        return;
      }
      notifyStatus("No push service reachable: this browser's push service " + why + ". Subscribing through the " +
        "development push service at " + dev.url + " instead…");
      return post("/push-dev", {}).then(function (subscription) {
        return register(subscription, user, "the development push service at " + dev.url, " through the " +
          "development push service: it takes the pushes in this browser's place (no notification shows here); " +
          "read them at " + dev.url + "/");
      });
    });
  }

  function subscribeWithin(reg, key) {
    return new Promise(function (resolve, reject) {
      var timer = setTimeout(function () {
        reject({ noService: "did not answer within " + SUBSCRIBE_WAIT / 1000 + " s" });
      }, SUBSCRIBE_WAIT);
      reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: base64ToBytes(key) }).then(
        function (s) { clearTimeout(timer); resolve(s); },
        function (e) {  // AbortError: "Registration failed - push service error / not available"
          clearTimeout(timer);
          reject(e && e.name === "AbortError" ? { noService: "refused: " + e.message } : e);
        });
    });
  }

  function notifyMe() {
    var user = $("user").value;
    localStorage.setItem("shmbus-demo-user", user);
    notifyStatus("asking for permission to notify…");
    return Notification.requestPermission().then(function (perm) {
      if (perm !== "granted") throw new Error("notifications are blocked for this page (the browser's site settings)");
      notifyStatus("subscribing with this browser's push service…");
      return Promise.all([navigator.serviceWorker.register("/sw.js"), fetch("/push/key").then(function (r) {
        return r.json();
      })]);
    }).then(function (both) {
      var reg = both[0], key = both[1].publicKey;
      return navigator.serviceWorker.ready.then(function () { return subscribeWithin(reg, key); }).then(
        function (subscription) {
          return register(subscription.toJSON(), user, "this browser's push service", "");
        },
        function (e) {
          if (e && e.noService) return noPushService(e.noService, user);
          throw e;
        });
    }).catch(function (e) { notifyStatus("notify me failed: " + (e && e.message ? e.message : String(e))); });
  }

  // The server gave up pushing to a device (its push service unreachable, or refusing): the page that registered
  // it says so, within the sender's retries (the demo's: 3 attempts, 5 s each at most).
  MB.subscribe("/demo/push-status", function (s) {
    if (!myDevice || s.device !== myDevice) return;
    notifyStatus("No push service reachable: the server could not push a chat message (global id " + s.global_id +
      ") to " + myService + " (" + s.outcome + ": " + s.why + ")." + (myService.indexOf("development") < 0 ?
      " " + DEV_HOWTO : " Is it still running?"));
  });

  if ("serviceWorker" in navigator && "PushManager" in window) {
    fetch("/push/key").then(function (r) {
      if (!r.ok) return;  // the server runs without the push extra
      pushAvailable = true;
      $("notify").hidden = false;
      $("notify").addEventListener("click", notifyMe);
    });
  }

  PAGES.forEach(function (page) {
    var b = el("button", "", "click " + page);
    b.addEventListener("click", function () { post("/click", { page: page, user: $("user").value }); });
    $("click-buttons").appendChild(b);
  });
})();
