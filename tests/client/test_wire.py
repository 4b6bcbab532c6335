"""The client's requests and its reading of answers, byte for byte, against a scripted server (stub.py): the
things a real server cannot be made to do on cue (a 429, a first chunk that never comes, an escaped separator),
and connection refused."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import httpx
import pytest

from shmbus.client import MessageBusClient, polling
from shmbus.client.pacing import JITTER, Backoff

from .recorder import Recorder, wait_until
from .stub import Reply, Seen, Stub

MakeClient = Callable[..., MessageBusClient]
STREAM = {"Content-Type": "text/plain; charset=utf-8"}


class Pacing:
    """What the client itself decided between polls: each successful poll's ``elapsed`` and the pause it then
    waited. Their sum is the spacing of two poll starts on the client's own clock, exactly: arrival gaps at the
    stub are not (a request delayed more than the next one on a loaded machine shortens the gap it ends)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.decided: list[tuple[float, float]] = []
        self.waited: list[float] = []
        self.backoffs: list[float] = []
        pause_after_poll, wait, failure = polling.pause_after_poll, polling.PollLoop._wait, Backoff.failure

        def recording_pause(**kw: Any) -> float:
            pause = pause_after_poll(**kw)
            self.decided.append((kw["elapsed"], pause))
            return pause

        async def recording_wait(loop: Any, seconds: float, interruptible: bool = True) -> None:
            self.waited.append(seconds)
            await wait(loop, seconds, interruptible)

        def recording_failure(backoff: Backoff) -> float:
            delay = failure(backoff)
            self.backoffs.append(delay)
            return delay

        monkeypatch.setattr(polling, "pause_after_poll", recording_pause)
        monkeypatch.setattr(Backoff, "failure", recording_failure)
        monkeypatch.setattr(polling.PollLoop, "_wait", recording_wait)

    def starts_apart(self) -> list[float]:
        """Seconds from each poll's start to the next one's, as the client paced them (pauses it really waited)."""
        assert self.decided, "no poll was paced"
        assert all(pause in self.waited for _, pause in self.decided if pause > 0), (self.decided, self.waited)
        return [elapsed + pause for elapsed, pause in self.decided]


@pytest.fixture
def pacing(monkeypatch: pytest.MonkeyPatch) -> Pacing:
    return Pacing(monkeypatch)


def status(channel: str, last: int) -> bytes:
    return b'[{"global_id":-1,"message_id":-1,"channel":"/__status","data":{"%s":%d}}]' % (channel.encode(), last)


def test_requests_as_the_js_client_sends_them(make_client: MakeClient, pacing: Pacing) -> None:
    with Stub(lambda seen, n: Reply(pieces=[status("/a", 5)] if n == 0 else [b"[]"])) as stub:
        client = make_client(
            stub.url + "/forum",
            chunked=False,
            headers={"X-Silence-Logger": "nope", "Authorization": "Bearer t"},
            callback_interval=0.2,
        )
        client.subscribe("/a", Recorder())
        wait_until(lambda: len(stub.seen) >= 6, what="six polls")
        client.stop()
    first, second, third = stub.seen[:3]
    assert re.fullmatch(r"/forum/message-bus/[0-9a-f]{32}/poll", first.path), first.path
    assert first.form == {"/a": "-1", "__seq": "1"} and second.form == {"/a": "5", "__seq": "2"}
    assert third.form["__seq"] == "3"
    assert first.headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert first.headers["Dont-Chunk"] == "true"
    assert first.headers["X-Silence-Logger"] == "nope" and first.headers["Authorization"] == "Bearer t"
    apart = pacing.starts_apart()  # nothing came, again and again: the pause doubles up to callback_interval
    assert min(apart[4:]) >= 0.2 and all(a >= 0.05 for a in apart), pacing.decided


def test_polling_mode_asks_dlp_and_waits_background_callback_interval(make_client: MakeClient, pacing: Pacing) -> None:
    with Stub(lambda seen, n: Reply()) as stub:
        client = make_client(stub.url, long_polling=False, background_callback_interval=0.4)
        client.subscribe("/a", Recorder())
        wait_until(lambda: len(stub.seen) >= 3, what="three polls")
        assert client.status == "started"
        client.stop()
    assert all(s.path.endswith("/poll?dlp=t") and s.headers["Dont-Chunk"] == "true" for s in stub.seen)
    assert all(s.headers["X-Silence-Logger"] == "true" for s in stub.seen)
    assert min(pacing.starts_apart()) >= 0.4, pacing.decided


def test_a_server_that_answers_at_once_is_not_polled_in_a_loop(make_client: MakeClient, pacing: Pacing) -> None:
    with Stub(lambda seen, n: Reply(headers=STREAM, pieces=[b"[]\r\n|\r\n"], chunked=True)) as stub:
        client = make_client(stub.url, callback_interval=0.5)  # min_poll_interval 0.05: 0.05, 0.1, 0.2, 0.4, 0.5...
        client.subscribe("/a", Recorder(), 0)
        wait_until(lambda: len(pacing.decided) >= 6, what="six polls paced")
        client.stop()
    # a loop would poll again at once: each empty answer in a row doubles the pause from min_poll_interval up to
    # callback_interval (on the client's clock: counting polls in a fixed sleep, or the stub's arrival gaps, failed
    # on a loaded machine)
    apart = pacing.starts_apart()
    assert all(a >= min(0.5, 0.05 * 2**i) for i, a in enumerate(apart)) and min(apart[4:]) >= 0.5, pacing.decided


def test_streamed_pieces_split_across_reads_and_read_by_content_type(make_client: MakeClient) -> None:
    msgs = [
        b'[{"global_id":7,"message_id":1,"channel":"/a","data":"x\\r\\n|\\r\\ny"}]\r\n|\r\n',
        0.2,
        b'[{"global_id":8,"message_id":2,"channel":"/a","data":2},',
        0.2,
        b'{"global_id":9,"message_id":3,"channel":"/a","data":3}]\r\n|\r\n[]\r\n|\r\n',
    ]

    def script(seen: Seen, n: int) -> Reply:
        if n == 0:
            return Reply(headers=STREAM, pieces=msgs, chunked=True)
        if n == 1:  # asked for a stream, answered with plain JSON: read as JSON (the Content-Type decides)
            return Reply(pieces=[b'[{"global_id":10,"message_id":4,"channel":"/a","data":4}]'])
        return Reply(pieces=[2.0, b"[]"])

    rec = Recorder()
    with Stub(script) as stub:
        client = make_client(stub.url)
        client.subscribe("/a", rec, 0)
        rec.wait(4)
        client.stop()
    assert [(m.message_id, m.global_id, m.data) for m in rec.messages] == [
        (1, 7, "x\r\n|\r\ny"),  # JSON escapes a separator inside a string itself
        (2, 8, 2),
        (3, 9, 3),
        (4, 10, 4),
    ]
    assert "Dont-Chunk" not in stub.seen[0].headers


def test_a_429_waits_its_retry_after_and_at_least_15_s(make_client: MakeClient, pacing: Pacing) -> None:
    def script(seen: Seen, n: int) -> Reply:
        return Reply(429, {"Retry-After": "1", "Content-Type": "text/plain"}, [b"slow down"]) if n == 0 else Reply()

    with Stub(script) as stub:
        client = make_client(stub.url)
        client.subscribe("/a", Recorder())
        time.sleep(2.0)
        assert len(stub.seen) == 1 and client.stats.rate_limited == 1  # 15 s at least, not the 1 s asked
        client.stop()
    assert pacing.waited == [15.0], pacing.waited
    pacing.waited.clear()
    with Stub(script) as stub:
        client = MessageBusClient(stub.url, callback_interval=0.2)
        client.core.min_retry_after = 0.3  # the floor lowered: now the server's own Retry-After (1 s) holds
        with client:
            client.subscribe("/a", Recorder())
            wait_until(lambda: len(stub.seen) >= 2, what="the retry")
    assert pacing.waited[0] == 1.0, pacing.waited  # the 429's own wait, then the polls' pauses


def test_no_first_chunk_falls_back_to_non_chunked(make_client: MakeClient) -> None:
    def script(seen: Seen, n: int) -> Reply:
        if "Dont-Chunk" in seen.headers:
            return Reply(pieces=[status("/a", 3)] if n == 1 else [0.3, b"[]"])
        return Reply(headers=STREAM, pieces=[3.0, b"[]\r\n|\r\n"], chunked=True)  # a buffering proxy

    with Stub(script) as stub:
        client = make_client(stub.url, first_chunk_timeout=0.5, retry_chunked_after=3)
        client.subscribe("/a", Recorder())
        wait_until(lambda: len(stub.seen) >= 6, timeout=20, what="the fallback and the retry of chunking")
        client.stop()
    chunked = ["Dont-Chunk" not in s.headers for s in stub.seen[:6]]
    assert chunked[:5] == [True, False, False, False, True], chunked
    assert client.stats.chunked_fallbacks >= 1


def test_connection_refused_backs_off_doubling_with_jitter(make_client: MakeClient, pacing: Pacing) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    attempts: list[float] = []

    class Recording(httpx.AsyncHTTPTransport):
        async def handle_async_request(self, request: httpx.Request) -> Any:
            attempts.append(time.monotonic())
            return await super().handle_async_request(request)

    client = make_client(
        f"http://127.0.0.1:{port}", transport=Recording(), min_poll_interval=0.1, max_poll_interval=0.8
    )
    client.subscribe("/a", Recorder())
    wait_until(lambda: len(pacing.backoffs) >= 6, what="six failed attempts")
    client.stop()
    # the delays the client chose and waited (on its own clock: attempt times seen from outside shift with load)
    delays = pacing.backoffs
    bases = [0.1, 0.2, 0.4, 0.8, 0.8, 0.8]  # doubling from 0.1, capped at 0.8
    for base, delay in zip(bases, delays[: len(bases)], strict=True):
        assert base * (1 - JITTER) <= delay <= base, (base, delay, delays)
    assert pacing.waited == delays, (pacing.waited, delays)
    assert len(set(delays[3:])) > 1, delays  # capped at 0.8, still jittered
    # (stop() may cancel the last attempt before it failed)
    assert client.stats.consecutive_failures == len(delays) and len(attempts) - 1 <= len(delays) <= len(attempts)


@pytest.mark.parametrize("bad", [b"not json", b'{"a": 1}', b"[1, 2]"])
def test_an_answer_that_is_not_the_protocol_is_a_failure_not_a_crash(make_client: MakeClient, bad: bytes) -> None:
    with Stub(lambda seen, n: Reply(pieces=[bad]) if n == 0 else Reply(pieces=[status("/a", 1)])) as stub:
        client = make_client(stub.url)
        client.subscribe("/a", Recorder())
        wait_until(lambda: client.positions == {"/a": 1}, what="the poll after the failure")
        assert client.stats.failures == 1 and "ProtocolViolation" in str(client.stats.last_error)


def test_stop_awaited_in_an_async_callback_ends_the_client_after_it() -> None:
    import asyncio

    from shmbus.client import AsyncMessageBusClient

    two = b"[%s,%s]" % tuple(b'{"global_id":%d,"message_id":%d,"channel":"/a","data":%d}' % (i, i, i) for i in (1, 2))

    async def main(url: str) -> tuple[list[int], str]:
        got: list[int] = []
        client = AsyncMessageBusClient(url)

        async def stop_at_first(msg: Any) -> None:
            got.append(msg.message_id)
            await client.stop()

        client.subscribe("/a", stop_at_first, 0)
        await client.start()
        await asyncio.sleep(0.5)
        return got, client.status

    with Stub(lambda seen, n: Reply(pieces=[two]) if n == 0 else Reply(pieces=[1.0, b"[]"])) as stub:
        assert asyncio.run(main(stub.url)) == ([1], "stopped")


def test_the_read_timeout_option_ends_a_silent_poll(make_client: MakeClient) -> None:
    with Stub(lambda seen, n: Reply(pieces=[1.5, b"[]"])) as stub:
        client = make_client(stub.url, timeout=0.5, chunked=False)
        client.subscribe("/a", Recorder(), 0)
        wait_until(lambda: client.stats.failures >= 1, what="the read timeout")
        assert "ReadTimeout" in str(client.stats.last_error)


def test_the_timeout_option_holds_for_an_injected_httpx_client_too(make_client: MakeClient) -> None:
    """An ``httpx.AsyncClient(auth=...)`` made with httpx's default timeout (5 s) would time out every long poll of
    a server that holds them 25 s: each poll carries the client's own ``timeout`` (60 s by default)."""
    msg = b'[{"global_id":1,"message_id":1,"channel":"/a","data":1}]'
    with Stub(lambda seen, n: Reply(pieces=[1.0, msg] if n == 0 else [2.0, b"[]"])) as stub:
        http = httpx.AsyncClient(timeout=0.3)  # shorter than the stub's hold, as httpx's 5 s is than Discourse's 25 s
        client = make_client(stub.url, http_client=http, timeout=10.0, chunked=False)
        rec = Recorder()
        client.subscribe("/a", rec, 0)
        rec.wait(1)
        assert client.stats.failures == 0, client.stats


class InFlight(httpx.AsyncHTTPTransport):
    """A transport that counts the polls in flight (from sending until their answer is closed)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = self.most = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            response = await super().handle_async_request(request)
        except BaseException:
            self.now -= 1
            raise
        return httpx.Response(response.status_code, headers=response.headers, stream=_Counted(response, self))


class _Counted(httpx.AsyncByteStream):
    def __init__(self, response: httpx.Response, counter: InFlight) -> None:
        self.response, self.counter, self.open = response, counter, True

    async def __aiter__(self) -> Any:
        async for piece in self.response.aiter_raw():
            yield piece

    async def aclose(self) -> None:
        if self.open:
            self.open = False
            self.counter.now -= 1
            await self.response.aclose()


def test_subscribe_and_unsubscribe_abort_the_poll_and_never_two_are_in_flight(make_client: MakeClient) -> None:
    # every poll is held 120 s, far past the test: a poll sent before that is the client aborting the one in flight
    with Stub(lambda seen, n: Reply(pieces=[120.0, b"[]"])) as stub:
        counter = InFlight()
        client = make_client(stub.url, transport=counter, chunked=False)
        client.subscribe("/a", Recorder(), 0)
        wait_until(lambda: len(stub.seen) == 1, what="the first poll")
        channels = {"/a"}
        for polls, change in enumerate(("+/b", "+/c", "-/b", "+/d", "-/c"), start=2):
            if change[0] == "+":
                client.subscribe(change[1:], Recorder(), 0)
                channels.add(change[1:])
            else:
                assert client.unsubscribe(change[1:]) is True
                channels.remove(change[1:])
            wait_until(lambda n=polls: len(stub.seen) >= n, timeout=60, what=f"the poll after {change}")
            sent = stub.seen[polls - 1]  # each change is sent at once, in a poll of its own
            assert set(sent.form) - {"__seq"} == channels, (change, sent, channels)
        client.stop()
    assert len(stub.seen) == 6 and counter.most == 1, (len(stub.seen), counter.most)


def test_one_success_resets_the_backoff(make_client: MakeClient, pacing: Pacing) -> None:
    def script(seen: Seen, n: int) -> Reply:
        if n in (0, 1, 2, 4):
            return Reply(500, {"Content-Type": "text/plain"}, [b"down"])
        return Reply(pieces=[status("/a", 1)] if n == 3 else [2.0, b"[]"])

    with Stub(script) as stub:
        client = make_client(stub.url, chunked=False, min_poll_interval=0.2, max_poll_interval=2.0)
        client.subscribe("/a", Recorder())
        wait_until(lambda: len(stub.seen) >= 6, what="six polls")
        client.stop()
    delays = pacing.backoffs  # as the client chose them (arrival gaps at the stub shift with load)
    assert delays[2] >= 0.8 * (1 - JITTER), delays  # the third failure in a row: 0.2 doubled twice
    assert delays[3] <= 0.2, delays  # the first failure after a success: 0.2 again, not 1.6


def test_a_stream_that_brought_data_then_broke_backs_off_from_the_start(make_client: MakeClient) -> None:
    """A server killed and restarted again and again under a stream that was serving: each break is the first
    failure of its outage, not one more of all the outages before (which made every retry wait
    ``max_poll_interval``, 180 s, after a few restarts)."""
    broken = Reply(headers=STREAM, chunked=True)
    with Stub(lambda seen, n: replace(broken, pieces=[status("/a", n + 1) + b"\r\n|\r\n", None])) as stub:
        client = make_client(stub.url, max_poll_interval=60.0)
        client.subscribe("/a", Recorder())
        wait_until(lambda: client.stats.failures >= 6, what="six broken streams")
        stats = client.stats
    assert stats.consecutive_failures <= 1 and "RemoteProtocolError" in (stats.last_error or ""), stats


def test_a_poll_ended_at_once_with_nothing_is_followed_at_once(make_client: MakeClient) -> None:
    """A server going down gracefully (gthread, puma) ends its held polls at once with nothing: the next poll
    (its restart) comes at once, not a ``callback_interval`` later; only answers like that in a row slow down."""
    replies = [status("/a", 1), b"[]", b'[{"global_id":2,"message_id":2,"channel":"/a","data":"after"}]']
    with Stub(lambda seen, n: Reply(pieces=[replies[min(n, 2)]] if n < 3 else [30.0, b"[]"])) as stub:
        client = make_client(stub.url, chunked=False, callback_interval=120.0)
        rec = Recorder()
        client.subscribe("/a", rec)
        rec.wait(1, timeout=60)  # (without the fix: 120 s)
    assert rec.data == ["after"]
