"""One poll over HTTP: the request the server expects, and its answer read whole or as it streams in.

Every read is bounded: an answer, or one piece of a streamed answer, stops at ``max_body_bytes``
(:class:`AnswerTooLarge`), an error's body at :data:`MAX_ERROR_BYTES`, a compressed body as it inflates
(:mod:`.inflate`); httpx bounds the status line and headers (h11: 100 KiB). The body is read raw and inflated
here, since httpx would inflate each network read whole.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol, TypeAlias
from urllib.parse import urlencode

import anyio
import httpx

from .chunks import AnswerTooLarge, ChunkParser, decode_array, is_streamed
from .inflate import ACCEPT_ENCODING, Inflater
from .outcomes import ClientStats, HeadersFailed, NoFirstChunk, PollFailed, RateLimited
from .pacing import retry_after_seconds
from .positions import NextPoll

__all__ = ["MAX_ERROR_BYTES", "Headers", "PollExchange", "PollSettings"]

#: the connect timeout of a poll, at most (seconds; the read timeout is the client's ``timeout``)
MAX_CONNECT_TIMEOUT = 10.0
#: ``take(request, items)``: apply one decoded array of the answer; True if it carried anything.
#: the most bytes of an error answer's body read (for the log); the rest is not read: the connection is closed
MAX_ERROR_BYTES = 4096
#: how long closing a response may take once its poll was aborted or stopped (seconds; it only closes a socket)
CLOSE_TIMEOUT = 5.0
Take = Callable[[NextPoll, list[dict[str, Any]]], bool]
#: A client's ``headers``: a mapping, or a callable called before each poll that returns one (or an awaitable of
#: one): a token that rotates, a session cookie (``{"Cookie": ...}``) read from where it is kept fresh.
Headers: TypeAlias = Mapping[str, str] | Callable[[], Mapping[str, str] | Awaitable[Mapping[str, str]]]


class PollSettings(Protocol):
    """The client options a poll reads (at each poll: they may change between polls)."""

    @property
    def poll_url(self) -> str: ...
    @property
    def long_polling(self) -> bool: ...
    @property
    def chunked(self) -> bool: ...
    @property
    def headers(self) -> Headers: ...
    @property
    def first_chunk_timeout(self) -> float: ...
    @property
    def min_retry_after(self) -> float: ...
    @property
    def timeout(self) -> float: ...
    @property
    def max_body_bytes(self) -> int: ...


class PollExchange:
    """Sends one poll and hands every array of the answer to ``take``, as it arrives. Raises
    :class:`RateLimited` (429), :class:`PollFailed` (another status, or :class:`HeadersFailed`),
    :class:`NoFirstChunk` (a streamed answer whose first chunk did not come in time: a buffering proxy;
    :meth:`unchunked` then asks for whole answers). ``answered()`` is called when a 200 answer's head arrives;
    ``room()``, when given, is awaited after each piece of the answer is taken (backpressure: it returns when the
    callbacks have caught up)."""

    def __init__(
        self,
        settings: PollSettings,
        stats: ClientStats,
        take: Take,
        answered: Callable[[], None] = lambda: None,
        room: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._settings = settings
        self._stats = stats
        self._take = take
        self._answered = answered
        self._room = room
        self._seq = 0
        self._unchunked = 0

    def unchunked(self, polls: int) -> None:
        """Ask for whole (not streamed) answers for the next ``polls`` polls."""
        self._unchunked = polls

    async def _headers(self) -> Mapping[str, str]:
        """The user's headers for this poll: the mapping, or what the callable gives now."""
        headers = self._settings.headers
        if not callable(headers):
            return headers
        try:
            value = headers()
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            raise HeadersFailed(f"the headers callable {headers!r} raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(value, Mapping):
            raise HeadersFailed(f"the headers callable {headers!r} returned {value!r}, not a mapping")
        return value

    def _request(
        self, http: httpx.AsyncClient, request: NextPoll, extra: Mapping[str, str]
    ) -> tuple[httpx.Request, bool]:
        settings = self._settings
        long_poll = settings.long_polling and not request.resolving
        chunked = long_poll and settings.chunked
        if chunked and self._unchunked > 0:
            self._unchunked -= 1
            chunked = False
        self._seq += 1
        headers = {
            "X-Silence-Logger": "true",
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept-Encoding": ACCEPT_ENCODING,
        }
        if not chunked:
            headers["Dont-Chunk"] = "true"
        headers.update(extra)
        body = urlencode([*request.body.items(), ("__seq", self._seq)])
        url = settings.poll_url if long_poll else settings.poll_url + "?dlp=t"
        # The client's own read timeout on every poll, an injected httpx client's too (httpx's default, 5 s, would
        # end every long poll a server holds for 25 s).
        timeout = httpx.Timeout(settings.timeout, connect=min(settings.timeout, MAX_CONNECT_TIMEOUT))
        return http.build_request("POST", url, content=body.encode(), headers=headers, timeout=timeout), chunked

    async def poll(self, http: httpx.AsyncClient, request: NextPoll) -> bool:
        """One poll: True if the server sent anything (messages or positions)."""
        http_request, chunked = self._request(http, request, await self._headers())
        self._stats.polls += 1
        first_by = self._settings.first_chunk_timeout if chunked else None
        try:
            with anyio.fail_after(first_by):
                response = await http.send(http_request, stream=True)
        except TimeoutError:
            raise NoFirstChunk() from None
        try:
            if response.status_code == 429:
                retry = retry_after_seconds(response.headers.get("retry-after"), self._settings.min_retry_after)
                raise RateLimited(retry)
            if response.status_code != 200:
                body = (await self._read(response, MAX_ERROR_BYTES, truncate=True))[:200].decode(errors="replace")
                raise PollFailed(f"{response.status_code} from {self._settings.poll_url}: {body!r}")
            self._answered()
            limit = self._settings.max_body_bytes
            if not is_streamed(response.headers.get("content-type")):
                got = self._take(request, decode_array(await self._read(response, limit)))
                if self._room is not None:
                    await self._room()
                return got
            return await self._read_stream(request, response, first_by, limit)
        finally:  # unread bytes left: httpcore closes the connection (an aborted poll's too: shielded)
            with anyio.move_on_after(CLOSE_TIMEOUT, shield=True):
                await response.aclose()

    async def _read(self, response: httpx.Response, limit: int, truncate: bool = False) -> bytes:
        """The whole body, inflated: at most ``limit`` bytes, else :class:`AnswerTooLarge`; with ``truncate``,
        its first ``limit`` bytes (the rest is not read)."""
        length = response.headers.get("content-length", "")
        if not truncate and length.isdigit() and "content-encoding" not in response.headers and int(length) > limit:
            raise AnswerTooLarge(f"an answer of {length} bytes", limit)
        inflater = Inflater(response.headers.get("content-encoding"))
        data = bytearray()
        async for raw in response.aiter_raw():
            self._stats.bytes += len(raw)
            for piece in inflater.feed(raw):
                data += piece
                if len(data) >= limit and truncate:
                    return bytes(data[:limit])
                if len(data) > limit:
                    raise AnswerTooLarge("an answer", limit)
        for piece in inflater.flush():
            data += piece
        if len(data) > limit and not truncate:
            raise AnswerTooLarge("an answer", limit)
        return bytes(data[:limit])

    async def _read_stream(
        self, request: NextPoll, response: httpx.Response, first_by: float | None, limit: int
    ) -> bool:
        parser = ChunkParser(limit)
        inflater = Inflater(response.headers.get("content-encoding"))
        got = False
        raws = response.aiter_raw().__aiter__()
        if first_by is not None:
            try:
                with anyio.fail_after(first_by):
                    first = await raws.__anext__()
            except TimeoutError:
                raise NoFirstChunk() from None
            except StopAsyncIteration:
                return False
            self._stats.bytes += len(first)
            got = self._feed(request, parser, inflater.feed(first))
        room = self._room
        while True:
            if room is not None:  # the callbacks catch up before anything more is read
                await room()
            try:
                raw = await raws.__anext__()
            except StopAsyncIteration:
                break
            self._stats.bytes += len(raw)
            got = self._feed(request, parser, inflater.feed(raw)) or got
        return self._feed(request, parser, inflater.flush()) or got

    def _feed(self, request: NextPoll, parser: ChunkParser, pieces: Iterable[bytes]) -> bool:
        got = False
        for data in pieces:
            for payload in parser.feed(data):
                got = self._take(request, decode_array(payload)) or got
        return got
