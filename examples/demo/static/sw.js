/* The demo's service worker (docs/push.md has the same, to copy): shows a notification for each push.
   A push carries {channel, message_id, global_id, data}; a message too large to push arrives as a "fetch"
   notice ({..., fetch: true}) and is read from /push/message. The tag is the message's global id, so a push
   repeated after a sender's crash (docs/push.md: the cursor's window) replaces its notification. */
self.addEventListener("push", function (event) {
  var push = event.data ? event.data.json() : {};
  var message = push.fetch
    ? fetch("/push/message?channel=" + encodeURIComponent(push.channel) + "&id=" + push.message_id,
            { credentials: "same-origin" }).then(function (r) { return r.ok ? r.json() : push; })
    : Promise.resolve(push);
  event.waitUntil(message.then(function (m) {
    var d = m.data || {};
    return self.registration.showNotification(d.user ? d.user + " on " + m.channel : m.channel, {
      body: d.text || "new message",
      tag: String(m.global_id),
      data: { url: "/" },
    });
  }));
});

self.addEventListener("notificationclick", function (event) {
  event.notification.close();
  event.waitUntil(clients.matchAll({ type: "window" }).then(function (open) {
    for (var i = 0; i < open.length; i++) if ("focus" in open[i]) return open[i].focus();
    return clients.openWindow(event.notification.data.url);
  }));
});
