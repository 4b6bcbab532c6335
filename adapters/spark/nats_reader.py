"""The Spark source's reader of a NATS JetStream stream, as the NATS bridge writes it (cluster mode).

Each channel is one subject of the stream (:mod:`shmbus.adapters.nats.layout`), so a channel's newest id is one
``STREAM.MSG.GET`` (``last_by_subj``), its oldest one more (``next_by_subj``), and a range is read with a pull
consumer filtered on its subject, in pages. Ids are stream sequences (sparse within a channel, as on PostgreSQL);
the stream has no epoch (0): a stream deleted and recreated shows as ids going backwards. Timestamps are the
stream's own (in each delivery's reply subject).
"""

from __future__ import annotations

from typing import Any

from shmbus import jsonlib
from shmbus.channels import backend_name
from shmbus.message import encode_meta

from ..nats import jetstream as js
from ..nats.client import NatsConnection
from ..nats.layout import channel_subject, split_data
from .chunk import Chunk, Location

__all__ = ["NatsReader"]


class NatsReader:
    """Reads one stream (``location.nats_url``, ``location.nats_stream``); see the module doc."""

    PAGE = 10_000

    def __init__(self, location: Location) -> None:
        assert location.nats_url
        self.location = location
        self.stream = location.nats_stream or "shmbus"
        self.conn = NatsConnection(location.nats_url, timeout=30, connect_timeout=10, name="shmbus spark")
        self.is_json = True
        info = js.stream_info(self.conn, self.stream)
        if info is None:
            self.conn.close()
            raise FileNotFoundError(f"no JetStream stream {self.stream!r} at {location.describe()}")
        subjects = info["config"].get("subjects") or [f"shmbus.{self.stream}.>"]
        self.prefix = str(subjects[0]).removesuffix(".>")

    def _subject(self, channel: str) -> str:
        return channel_subject(self.prefix, backend_name(channel, self.location.site_id)).decode()

    def _get(self, body: dict[str, Any]) -> int:
        try:
            out = js.api(self.conn, f"STREAM.MSG.GET.{self.stream}", body)
        except js.JsError as exc:
            if exc.err_code == js.NOT_FOUND_MESSAGE or exc.code == 404:
                return 0
            raise
        return int(out["message"]["seq"])

    def epoch(self) -> int:
        return 0

    def last_ids(self, channels: list[str]) -> dict[str, int]:
        return {ch: self._get({"last_by_subj": self._subject(ch)}) for ch in channels}

    def _first(self, channel: str) -> int:
        return self._get({"seq": 1, "next_by_subj": self._subject(channel)})

    def first_available(self, channel: str) -> int:
        return self._first(channel) or self.last_ids([channel])[channel] + 1

    def read(self, channel: str, after: int, upto: int) -> Chunk:
        out = Chunk(is_json=True, sparse=True)
        first = self._first(channel)
        held = after == 0 or (0 < first <= after)  # a message at or before ``after`` still there: none trimmed
        reader = js.PullReader(self.conn, self.stream, filter_subject=self._subject(channel))
        try:
            reader.ready_for(after)
            cur = after
            while cur < upto:
                page, complete = reader.read(cur, self.PAGE)
                for seq, reply, data in page:
                    if seq > upto:
                        complete = True
                        break
                    cur = seq
                    parts = split_data(data)
                    if parts is None:
                        continue  # not the bridge's: the relays skip it too
                    envelope = jsonlib.loads(parts[1])
                    out.message_ids.append(seq)
                    out.global_ids.append(seq)
                    out.timestamps.append(js.ack_time(reply))
                    out.payloads.append(jsonlib.dumps_lenient(envelope.get("data")))
                    c, u, g = envelope.get("client_ids"), envelope.get("user_ids"), envelope.get("group_ids")
                    out.metas.append(encode_meta(c, u, g) if (c or u or g) else b"")
                if complete or not page:
                    break
        finally:
            reader.close()
        out.last_id = self.last_ids([channel])[channel]
        if held:
            out.first_available = after + 1
        else:
            out.first_available = out.message_ids[0] if out.message_ids else out.last_id + 1
        return out

    def decode(self, payload: bytes) -> Any:
        return jsonlib.loads(payload)

    def close(self) -> None:
        self.conn.close()
