"""What the development push service keeps of a push (:class:`ReceivedPush`) and how a developer sees it: the page at
``GET /`` and the JSON of ``GET /deliveries``. Sans-IO (the server is :mod:`.devservice`)."""

from __future__ import annotations

import html
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ReceivedPush", "deliveries_view", "delivery_json", "index_page"]


@dataclass
class ReceivedPush:
    """A push the service took: the subscription's token, what the browser would get, the RFC 8030 headers."""

    token: str
    payload: Any  # decrypted: JSON when it is JSON, else text; None for a push without a body
    ttl: int
    urgency: str | None
    topic: str | None
    at: float
    seq: int = 0  # 1, 2, ... in the order taken (``GET /deliveries?after=SEQ``)


def delivery_json(d: ReceivedPush, origin: str) -> dict[str, Any]:
    return {"seq": d.seq, "endpoint": f"{origin}/push/{d.token}", "payload": d.payload, "ttl": d.ttl,
            "urgency": d.urgency, "topic": d.topic, "at": d.at}  # fmt: skip


def deliveries_view(
    query: dict[str, list[str]],
    deliveries: Sequence[ReceivedPush],
    refusals: Sequence[tuple[str, int, str]],
    origin: str,
) -> dict[str, Any]:
    """``GET /deliveries``: those of one subscription (``endpoint`` or ``token``) newer than ``after``, and the
    refusals of that subscription (all of both without them)."""
    endpoint = (query.get("endpoint") or [""])[-1]
    token = endpoint.rsplit("/", 1)[-1] if endpoint else (query.get("token") or [""])[-1]
    after = (query.get("after") or ["0"])[-1]
    since = int(after) if after.isdigit() else 0
    return {
        "deliveries": [delivery_json(d, origin) for d in deliveries if d.seq > since and token in ("", d.token)],
        "refusals": [{"token": t, "status": s, "reason": why} for t, s, why in refusals if token in ("", t)],
    }


_STYLE = (
    "body{font:14px system-ui,sans-serif;margin:1.5em;max-width:72em}"
    ".dev{background:#fff3cd;border:1px solid #e0b000;padding:.6em 1em}"
    "table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #ddd;padding:.3em;text-align:left;"
    "vertical-align:top}code,pre{font:12px ui-monospace,monospace;white-space:pre-wrap;margin:0}"
)


def index_page(
    origin: str, subscriptions: int, deliveries: Sequence[ReceivedPush], refusals: Sequence[tuple[str, int, str]]
) -> str:
    """The page a developer keeps open: what to do with the service, then the newest pushes first (it reloads
    itself every 2 s)."""
    esc = html.escape
    rows = "".join(
        f"<tr><td>{d.seq}</td><td>{esc(time.strftime('%H:%M:%S', time.localtime(d.at)))}</td>"
        f"<td><code>…{esc(d.token[-8:])}</code></td><td>{d.ttl}</td><td>{esc(d.urgency or '')}</td>"
        f"<td>{esc(d.topic or '')}</td><td><pre>{esc(json.dumps(d.payload, indent=1, default=str))}</pre></td></tr>"
        for d in reversed(deliveries)
    )
    refused = "".join(
        f"<tr><td><code>…{esc(t[-8:])}</code></td><td>{status}</td><td>{esc(why)}</td></tr>"
        for t, status, why in reversed(refusals)
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="2">
<title>shmbus development push service</title><style>{_STYLE}</style></head><body>
<h1>shmbus development push service</h1>
<p class="dev"><b>For development only: not a real push service.</b> It delivers nothing to any browser. It takes
Web Push requests (RFC 8030, VAPID, aes128gcm) to the subscriptions it handed out, checks them as a push service
would, decrypts them with those subscriptions' keys (it plays the browser) and shows them below. Nothing is kept
on disk.</p>
<p>At <code>{esc(origin)}</code>: {subscriptions} subscription(s) handed out.
<code>POST {esc(origin)}/subscriptions</code> with
<code>{{"applicationServerKey": "&lt;the app's VAPID public key&gt;"}}</code> (application/json) makes one: register
what it answers with your app, as a page registers its <code>PushSubscription</code>.
<code>GET /deliveries?endpoint=URL</code> lists what was pushed to one as JSON. The app's sender must be allowed to
reach this address and port: see <code>docs/push.md</code>, "The development push service".</p>
<h2>Pushes taken (newest first)</h2>
<table><tr><th>#</th><th>at</th><th>subscription</th><th>TTL</th><th>urgency</th><th>topic</th>
<th>payload (decrypted)</th></tr>
{rows or '<tr><td colspan="7">none yet</td></tr>'}</table>
<h2>Refused</h2>
<table><tr><th>subscription</th><th>status</th><th>why</th></tr>
{refused or '<tr><td colspan="3">none</td></tr>'}</table>
</body></html>
"""
