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
  function base64ToBytes(b64) {
    var raw = atob(b64.replace(/-/g, "+").replace(/_/g, "/") + "==".slice(0, (4 - b64.length % 4) % 4));
    return Uint8Array.from(raw, function (c) { return c.charCodeAt(0); });
  }

  function notifyMe() {
    var user = $("user").value;
    localStorage.setItem("shmbus-demo-user", user);
    return Notification.requestPermission().then(function (perm) {
      if (perm !== "granted") throw new Error("notifications are blocked for this page");
      return Promise.all([navigator.serviceWorker.register("/sw.js"), fetch("/push/key").then(function (r) {
        return r.json();
      })]);
    }).then(function (both) {
      var reg = both[0], key = both[1].publicKey;
      return navigator.serviceWorker.ready.then(function () {
        return reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: base64ToBytes(key) });
      });
    }).then(function (subscription) {
      return fetch("/push/subscriptions", {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-Demo-User": user },
        body: JSON.stringify({ subscription: subscription.toJSON(), topics: ["/chat"] }),
      });
    }).then(function (r) {
      if (!r.ok) throw new Error("/push/subscriptions: HTTP " + r.status);
      $("notify-status").textContent = "notifications on for new chat messages (as " + user + ")";
    }).catch(function (e) { $("notify-status").textContent = String(e); });
  }

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
