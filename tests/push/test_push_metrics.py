"""Push figures in the Prometheus endpoint (text and prometheus_client collector) and the admin page, read from
the store, so any worker reports the sender's cluster-wide totals."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx

from shmbus import Bus
from shmbus.adapters.admin import AdminWSGIApp
from shmbus.adapters.metrics import BusCollector, MetricsWSGIApp, render
from shmbus.adapters.push import PushConnector, VapidKeys
from shmbus.adapters.push.devservice import PushService
from tests.harness.wait import wait_for

from .push_util import register, wait_leading


def test_metrics_and_admin_show_push_figures(
    bus: Bus, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    c = connector().start()
    reader = connector()  # another worker's connector: never elected while c leads, same figures
    ok, gone = push_service.subscribe(vapid.public_key), push_service.subscribe(vapid.public_key)
    register(c, ok, 1, ["/m"])
    register(c, gone, 2, ["/m"])
    push_service.set_mode(gone, "gone", arg=410)
    wait_leading(c)
    bus.publish("/m", "x")
    wait_for(lambda: c.stats()["sent"] == 1 and c.stats()["expired"] == 1, what="counted")
    assert not reader.leading and reader.stats()["sent"] == 1

    text = render(bus, [reader.metric_families])
    labels = f'{{bus="{bus.name}",namespace="default"}}'
    for line in (
        f"shmbus_push_sent_total{labels} 1",
        f"shmbus_push_expired_total{labels} 1",
        f"shmbus_push_failed_total{labels} 0",
        f"shmbus_push_retried_total{labels} 0",
        f"shmbus_push_queue_depth{labels} 0",
        f"shmbus_push_sender_up{labels} 1",
        f"shmbus_push_cursor{labels} {bus.segment.global_id()}",
    ):
        assert line in text.splitlines(), line
    with httpx.Client(
        transport=httpx.WSGITransport(MetricsWSGIApp(bus=bus, extra=[reader.metric_families])), base_url="http://t"
    ) as client:
        assert f"shmbus_push_sent_total{labels} 1" in client.get("/metrics").text
    got = {f.name: f for f in BusCollector(bus, [reader.metric_families]).collect()}
    assert got["shmbus_push_sent"].samples[0].value == 1

    admin = AdminWSGIApp(bus=bus, is_admin_lookup=lambda _e: True, panels={"push": reader.stats})
    with httpx.Client(transport=httpx.WSGITransport(admin), base_url="http://t") as client:
        doc = json.loads(client.get("/admin/snapshot.json").text)
    panel = doc["panels"]["push"]
    assert (panel["sent"], panel["expired"], panel["leading_here"]) == (1, 1, False)
    assert panel["leader"].endswith(f":{__import__('os').getpid()}")
