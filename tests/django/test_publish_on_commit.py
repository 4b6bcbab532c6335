"""``publish_on_commit`` publishes when the surrounding transaction commits and never for a rolled-back one.

With a real PostgreSQL (a private database per test) in a child process, as an app runs: while the transaction
is open nothing is published and the row is invisible to others; once it commits, a subscriber in another
process hears of the row and can read it at that moment; a rolled-back transaction, or a rolled-back savepoint
inside a committed one, publishes nothing. In-process with SQLite: bad input raises at the call, and the data
is captured at the call.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from shmbus import Bus, InvalidChannel, InvalidMessage, InvalidMessageTarget
from shmbus.adapters.integrations.django import get_bus, publish_on_commit
from tests import harness

from .dj_util import DJTEST_DIR

CHILD = """
import json, sys
import django
django.setup()
from django.db import connection, transaction
from shmbus.adapters.integrations.django import publish_on_commit

def insert(text):
    with connection.cursor() as c:
        c.execute("INSERT INTO note (text) VALUES (%s) RETURNING id", [text])
        return c.fetchone()[0]

with connection.cursor() as c:
    c.execute("CREATE TABLE note (id serial PRIMARY KEY, text text)")
with transaction.atomic():
    row = insert("kept")
    publish_on_commit("/notes", {"id": row})
    print(json.dumps({"row": row}), flush=True)
    sys.stdin.readline()  # the test looks at the bus and the table while this transaction is open
try:
    with transaction.atomic():
        publish_on_commit("/notes", {"id": insert("rolled back")})
        raise RuntimeError
except RuntimeError:
    pass
with transaction.atomic():
    try:
        with transaction.atomic():
            publish_on_commit("/notes", {"id": insert("savepoint rolled back")})
            raise RuntimeError
    except RuntimeError:
        pass
    publish_on_commit("/notes", {"id": insert("outer")})
print("done", flush=True)
"""


@pytest.fixture
def private_database(database_url: str, bus_name: str) -> Iterator[str]:
    """A database of its own for this test (dropped afterwards): its URL."""
    psycopg = harness.require_module("psycopg")
    name = f"dj_{bus_name}".lower()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield urlunsplit(urlsplit(database_url)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.mark.postgres
def test_published_after_commit_only_with_postgresql(private_database: str, bus_name: str, procs: Any) -> None:
    import psycopg

    bus = Bus(bus_name, ring_size=1 << 20, max_channels=256, keepalive_interval=0, create=True)
    heard: queue.Queue[tuple[Any, Any]] = queue.Queue()
    reader = psycopg.connect(private_database, autocommit=True)

    def on_note(msg: Any) -> None:  # another process, another connection: can it read the row it hears of?
        row = reader.execute("SELECT text FROM note WHERE id = %s", [msg.data["id"]]).fetchone()
        heard.put((msg.data["id"], row[0] if row else None))

    try:
        bus.subscribe("/notes", on_note)
        child = procs.spawn(
            [sys.executable, "-c", CHILD],
            env={
                "DJANGO_SETTINGS_MODULE": "djtest.settings",
                "SHMBUS_TEST_BUS": bus_name,
                "SHMBUS_TEST_PG": private_database,
            },
            app_dir=DJTEST_DIR,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        first = json.loads(child.stdout.readline() or "{}")
        assert "row" in first, "the child did not reach its open transaction"
        assert bus.last_id("/notes") == 0 and heard.empty(), "published before the commit"
        assert reader.execute("SELECT count(*) FROM note").fetchone()[0] == 0
        child.stdin.write("\n")
        child.stdin.flush()
        assert heard.get(timeout=10) == (first["row"], "kept"), "heard of the row before it could be read"
        assert child.stdout.readline().strip() == "done"
        assert child.wait(timeout=30) == 0
        texts = [m.data["id"] for m in bus.backlog("/notes", 0)]
        rows = dict(reader.execute("SELECT id, text FROM note").fetchall())
        assert [rows[i] for i in texts] == ["kept", "outer"], "a rolled-back transaction or savepoint published"
        assert heard.get(timeout=10)[1] == "outer"
    finally:
        reader.close()
        bus.destroy()


def test_commit_and_rollback_in_process(shmbus_setting: Any) -> None:
    from django.db import transaction

    bus = get_bus()
    data = {"n": 1}
    with transaction.atomic():
        publish_on_commit("/c", data)
        data["n"] = 2  # changes after the call are not published
        assert bus.last_id("/c") == 0
    assert [m.data for m in bus.backlog("/c", 0)] == [{"n": 1}]
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        publish_on_commit("/c", "never")
        1 / 0  # noqa: B018
    publish_on_commit("/c", "autocommit: at once")
    assert [m.data for m in bus.backlog("/c", 0)] == [{"n": 1}, "autocommit: at once"]


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        (("/a\x00b", 1), {}, InvalidChannel),
        ((None, 1), {}, InvalidChannel),
        (("/c", object()), {}, TypeError),
        (("/c", 1), {"user_ids": "42"}, InvalidMessageTarget),
        (("/c", 1), {"group_ids": []}, InvalidMessageTarget),
        (("/c", 1), {"usr_ids": [1]}, TypeError),
        (("/c", 1), {"site_id": 5}, InvalidChannel),
        (("/c", 1), {"max_backlog_size": 0}, InvalidMessage),
        (("/c", 1), {"max_backlog_age": -1}, InvalidMessage),
    ],
)
def test_bad_input_raises_at_the_call(shmbus_setting: Any, args: Any, kwargs: Any, error: type[Exception]) -> None:
    from django.db import transaction

    with transaction.atomic():
        with pytest.raises(error):
            publish_on_commit(*args, **kwargs)
        publish_on_commit("/c", "good")
    assert [m.data for m in get_bus().backlog("/c", 0)] == ["good"]
