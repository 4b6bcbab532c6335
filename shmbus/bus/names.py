"""Names as stored: channel and site keys (validated once, cached) and records decoded into messages."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..channels import GLOBAL_PREFIX, SITE_SEPARATOR_BYTES, channel_key, check_site
from ..codecs import Codec
from ..message import Message, messages_of_rows
from ..segment import Record, Row

__all__ = ["Names"]


class Names:
    """Turns the API's names into the segment's keys and the segment's records into :class:`Message` objects.

    Every cache is bounded (cleared past a size): ids of any shape cannot grow it. ``channel_keys`` is public for
    the publisher's fast path (a dict lookup before any call).
    """

    def __init__(self, codec: Codec, site_id_lookup: Callable[[], str | None] | None) -> None:
        self.codec = codec
        self.site_id_lookup = site_id_lookup
        self.channel_keys: dict[str, bytes] = {}
        self._site_keys: dict[str, bytes] = {}
        self._decoded: dict[bytes, str] = {}

    def channel_key(self, channel: Any) -> bytes:
        """The channel's UTF-8 name, validated once and cached (see :mod:`shmbus.channels`)."""
        return _cached_name(self.channel_keys, channel, channel_key, 50_000)

    def site_key(self, site_id: Any) -> bytes:
        """The site's UTF-8 name, validated once and cached."""
        return _cached_name(self._site_keys, site_id, check_site, 10_000)

    def resolve_site(self, channel: str, site_id: str | None) -> str | None:
        """The site a call on ``channel`` means: none on ``/global/`` channels, else ``site_id`` or the lookup's."""
        self.channel_key(channel)  # a typed InvalidChannel for None, lists, NUL, ... (cached once valid)
        if channel.startswith(GLOBAL_PREFIX):
            return None
        if site_id is None and self.site_id_lookup is not None:
            site_id = self.site_id_lookup()
        return site_id or None

    def key(self, channel: str, site_id: str | None) -> bytes:
        """The segment's key of ``channel`` on ``site_id``."""
        ch = self.channel_key(channel)
        return ch + SITE_SEPARATOR_BYTES + self.site_key(site_id) if site_id else ch

    def forget_channels(self) -> None:
        """Drop the channel cache (the bus was reset)."""
        self.channel_keys.clear()

    def message(self, record: Record, epoch: int) -> Message:
        """A record as a :class:`Message`; channel names are decoded once per process (cached)."""
        name = self._decoded.get(record.channel)
        if name is None:
            name = self._channel_name(record.channel)
        site = record.site.decode() if record.site else None
        return Message(
            record.global_id,
            record.message_id,
            name,
            record.payload,
            self.codec,
            site_id=site,
            meta=record.meta,
            timestamp=record.timestamp,
            epoch=epoch,
        )

    def messages(self, rows: list[Row], epoch: int) -> list[Message]:
        """The rows of a read (``Segment.read_rows``) as messages: the listener's batch, decoded in one loop."""
        return messages_of_rows(rows, self.codec, epoch, self._decoded, self._channel_name)

    def _channel_name(self, channel: bytes) -> str:
        """A channel's name as a string, decoded and cached (bounded)."""
        name = channel.decode()
        if len(self._decoded) > 50_000:
            self._decoded.clear()
        self._decoded[channel] = name
        return name


def _cached_name(cache: dict[str, bytes], name: Any, check: Callable[[Any], bytes], most: int) -> bytes:
    """``check(name)``, remembered in ``cache`` (cleared past ``most`` names)."""
    try:
        cached = cache.get(name)
    except TypeError:  # not even hashable: check() says why
        cached = None
    if cached is not None:
        return cached
    encoded = check(name)
    if len(cache) > most:
        cache.clear()
    cache[name] = encoded
    return encoded
