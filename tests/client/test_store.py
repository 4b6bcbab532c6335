"""Position stores: a client saves its positions while it runs and on stop, and a new client made with the same
store resumes exactly there (no loss, no duplicate), against the lean worker and the gem. FilePositionStore's
writes are atomic, and a store that fails is counted, not fatal."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from shmbus.client import FilePositionStore, MessageBusClient, PositionStore

from .recorder import Recorder, resolved, wait_until
from .servers import Target

MakeClient = Callable[..., MessageBusClient]


@pytest.mark.slow
def test_a_new_client_resumes_from_the_store(
    server: Target, make_client: MakeClient, channel: str, tmp_path: Path
) -> None:
    store = FilePositionStore(tmp_path / "positions.json")
    ids = [server.publish(channel, i) for i in range(3)]
    first = make_client(server.url, position_store=store, save_interval=0.05)
    rec = Recorder()
    first.subscribe(channel, rec, 0)
    rec.wait(3)
    wait_until(lambda: store.load() == {channel: ids[-1]}, what="a save while the client runs")
    ids.append(server.publish(channel, 3))
    rec.wait(4)
    first.stop()
    assert store.load() == {channel: ids[-1]}  # the last one, saved on stop
    missed = [server.publish(channel, i) for i in (4, 5)]
    second = make_client(server.url, position_store=store)
    rec2 = Recorder()
    second.subscribe(channel, rec2)  # no last_id: from the stored position
    rec2.wait(2)
    live = server.publish(channel, 6)
    rec2.wait(3)
    resolved(second, channel)
    assert rec.ids == ids and rec2.ids == [*missed, live]


@pytest.mark.slow
def test_channels_left_and_channels_of_the_store_keep_their_position(
    server: Target, make_client: MakeClient, channel: str, tmp_path: Path
) -> None:
    store = FilePositionStore(tmp_path / "positions.json")
    store.save({"/elsewhere": 7})
    client = make_client(server.url, position_store=store, save_interval=0.05)
    quiet = client.subscribe(channel + "/quiet", Recorder())  # from now, on an empty channel: position 0
    rec = Recorder()
    client.subscribe(channel, rec)
    resolved(client, channel)
    mid = server.publish(channel, "one")
    rec.wait(1)
    wait_until(lambda: store.load().get(channel + "/quiet") == 0, what="the quiet channel saved")
    client.remove(quiet)
    client.stop()
    assert store.load() == {"/elsewhere": 7, channel + "/quiet": 0, channel: mid}


def test_file_store_writes_whole_files_or_nothing(tmp_path: Path) -> None:
    path = tmp_path / "positions.json"
    store = FilePositionStore(path)
    assert store.load() == {}
    store.save({"/a": 3, "/b": 0})
    assert json.loads(path.read_text()) == {"/a": 3, "/b": 0}
    inode = path.stat().st_ino
    with pytest.raises(TypeError):
        store.save({"/a": object()})  # type: ignore[dict-item]  # fails half-way through the JSON
    assert store.load() == {"/a": 3, "/b": 0}  # the old file, whole
    store.save({"/a": 4})
    assert path.stat().st_ino != inode  # a new file renamed over the old one
    assert sorted(os.listdir(tmp_path)) == ["positions.json"]  # no temporary file left
    path.write_text('{"/a": "x"}')
    with pytest.raises(ValueError, match="not a channel and an id"):
        store.load()
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        MessageBusClient("http://127.0.0.1:9", position_store=store)  # at once, not at the first subscribe


def test_options_are_checked() -> None:
    store = FilePositionStore("/nonexistent/positions.json")
    assert isinstance(store, PositionStore)
    with pytest.raises(ValueError, match="positions or position_store"):
        MessageBusClient("http://127.0.0.1:9", positions={"/a": 1}, position_store=store)
    with pytest.raises(TypeError, match="position_store"):
        MessageBusClient("http://127.0.0.1:9", position_store={"/a": 1})


class FlakyStore:
    """A store whose first saves fail (a Redis that is down for a while)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.saved: dict[str, int] = {}

    def load(self) -> Mapping[str, int]:
        return {}

    def save(self, positions: Mapping[str, Any]) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("the store is down")
        self.saved = dict(positions)


@pytest.mark.slow
def test_a_store_that_fails_is_counted_and_tried_again(
    server: Target, make_client: MakeClient, channel: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = FlakyStore(failures=2)
    client = make_client(server.url, position_store=store, save_interval=0.05)
    rec = Recorder()
    client.subscribe(channel, rec)
    resolved(client, channel)
    mid = server.publish(channel, "one")
    rec.wait(1)
    wait_until(lambda: store.saved.get(channel) == mid, what="a save once the store is back")
    assert client.stats.store_errors == 2
    assert sum("saving positions" in r.getMessage() for r in caplog.records) == 2


def docs_recipe(name: str) -> dict[str, Any]:
    """The namespace of the docs' (docs/client.md) python block that defines ``class name``, up to its example."""
    from tests.docs.test_doc_blocks import ALL

    code = next(c for f, _, lang, c, _ in ALL if f == "docs/client.md" and f"class {name}" in c)
    namespace: dict[str, Any] = {}
    exec(code.split("\nbus = ")[0], namespace)
    return namespace


@pytest.mark.slow
def test_the_documented_redis_store_resumes_a_client(
    server: Target, make_client: MakeClient, channel: str, redis_url: str, bus_name: str
) -> None:
    import redis

    recipe = docs_recipe("RedisPositions")
    r = redis.Redis.from_url(redis_url)
    key = f"{bus_name}:positions"
    try:
        first = make_client(server.url, position_store=recipe["RedisPositions"](r, key))
        rec = Recorder()
        first.subscribe(channel, rec)
        resolved(first, channel)
        mid = server.publish(channel, "one")
        rec.wait(1)
        first.stop()
        assert r.hgetall(key) == {channel.encode(): str(mid).encode()}
        missed = server.publish(channel, "two")
        second = make_client(server.url, position_store=recipe["RedisPositions"](r, key))
        rec2 = Recorder()
        second.subscribe(channel, rec2)
        rec2.wait(1)
        assert rec.ids == [mid] and rec2.ids == [missed]
    finally:
        r.delete(key)
        r.close()
