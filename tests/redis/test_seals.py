"""The bridge kit's seal check on its own (no server): which rows a ring's seals vouch for."""

from __future__ import annotations

import pytest

from shmbus.adapters.bridge.rows import DoorbellRing
from shmbus.adapters.bridge.seals import Sealer, mac, sealed_rows

KEY, HISTORY = b"k" * 64, 42


def line(gid: int, data: str) -> bytes:
    return b'%d|%d|/c|{"data":"%s"}' % (gid, gid, data.encode())


def ids(ring: DoorbellRing, after: int) -> list[int]:
    return [row.global_id for row in sealed_rows(ring, Sealer("sha1", KEY, HISTORY), after)]


def test_a_run_is_taken_whole_and_only_after_the_position() -> None:
    run = [line(g, f"m{g}") for g in (5, 6, 7)]
    ring = DoorbellRing(7, run, {5: (7, mac("sha1", KEY, HISTORY, run))})
    assert ids(ring, 4) == [5, 6, 7]
    assert ids(ring, 6) == [7]  # 5 and 6 stored already
    assert ids(ring, 3) == []  # 4 is missing: the read decides
    assert ids(DoorbellRing(7, run[:2], ring.seals), 4) == []  # a line of the run never came


def test_runs_in_any_order_verify_each_and_stop_at_the_first_that_does_not() -> None:
    one, two = [line(5, "a"), line(6, "b")], [line(7, "c")]
    seals = {7: (7, mac("sha1", KEY, HISTORY, two)), 5: (6, mac("sha1", KEY, HISTORY, one))}
    assert ids(DoorbellRing(7, [two[0], one[1], one[0]], seals), 4) == [5, 6, 7]
    forged = {**seals, 7: (7, mac("sha1", KEY, HISTORY + 1, two))}  # another history
    assert ids(DoorbellRing(7, [*one, *two], forged), 4) == [5, 6]


def test_the_same_bytes_cut_into_other_lines_do_not_verify() -> None:
    """Each line enters the seal with its length: a writer's envelope that looks like a line cannot be split off as
    one (the forged cut below concatenates to the very bytes the backend sealed)."""
    real = [line(5, "x6|6|/c|evil"), line(6, "b")]
    cut = [real[0][: real[0].index(b"6|6|")], real[0][real[0].index(b"6|6|") :] + real[1]]
    assert b"".join(cut) == b"".join(real)
    tag = mac("sha1", KEY, HISTORY, real)
    assert ids(DoorbellRing(6, real, {5: (6, tag)}), 4) == [5, 6]
    assert ids(DoorbellRing(6, cut, {5: (6, tag)}), 4) == []


@pytest.mark.parametrize("hash_name", ["sha1", "sha256"])
def test_the_relays_hashes_seal_as_hashlib_does(hash_name: str) -> None:
    """The relay's Sealer may use CPython's own SHA code (cheaper per cold call than OpenSSL's): its seals must be
    hashlib's, byte for byte, for every run (the backends' scripts are checked against ``mac`` elsewhere)."""
    import random

    rng = random.Random(7)
    for n in range(1, 40):
        key = rng.randbytes(rng.choice([16, 32, 64, 100]))
        history = rng.randrange(1, 1 << 63)
        lines = [rng.randbytes(rng.randrange(0, 300)) for _ in range(rng.randrange(1, 6))]
        assert Sealer(hash_name, key, history).mac(lines) == mac(hash_name, key, history, lines), n


def test_parse_line_reads_the_gems_lines_and_refuses_the_rest() -> None:
    from shmbus.adapters.bridge.wire import parse_line

    assert parse_line(b'12|3|/a$$123$$b|{"data":1}') == (12, 3, "/a|b", b'{"data":1}')
    assert parse_line(b"12|3|/a|x|y|") == (12, 3, "/a", b"x|y|")  # the envelope is everything after the third |
    for bad in (b"", b"12", b"12|3", b"12|3|/a", b"12|3|/a|", b"x|3|/a|{}", b"12|y|/a|{}", b"1|2|\xff|{}"):
        assert parse_line(bad) is None, bad


class CountingLines(dict[int, bytes]):
    """The ring's lines by id, counting how many ids were looked up (the work a seal's range can cause); past
    ``LIMIT`` lookups the check has failed already, so it stops there rather than run for the whole range."""

    LIMIT = 1000
    lookups = 0

    def get(self, key: int, default: bytes | None = None) -> bytes | None:  # type: ignore[override]
        CountingLines.lookups += 1
        if CountingLines.lookups > self.LIMIT:
            raise AssertionError("a seal's range caused work beyond the ring's size")
        return super().get(key, default)


@pytest.mark.parametrize("last", [1_000_000, 99_999_999_999, (1 << 63) - 1])
def test_a_forged_seals_range_costs_nothing_beyond_the_ring(last: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 31, 1: one notice plus the seal ``1|99999999999|zz`` made the relay build a list over the whole range
    before checking anything (19 s of CPU per 20 s; 10**20: forever). A run that names more ids than the ring holds
    lines cannot be whole: refused before any work proportional to it, counted here in id lookups."""
    from shmbus.adapters.bridge import seals

    by_id = seals._by_id
    monkeypatch.setattr(seals, "_by_id", lambda lines: CountingLines(by_id(lines)))
    CountingLines.lookups = 0
    forged = seals.seal_of(b"1|%d|zz" % last)
    assert forged is not None
    real = [line(5, "a"), line(6, "b")]
    ring = DoorbellRing(last, [line(1, "forged"), *real], {1: forged[1:], 5: (6, mac("sha1", KEY, HISTORY, real))})
    assert ids(ring, 0) == []  # the read decides
    assert ids(ring, 4) == [5, 6]  # the forged range lies below the position's run: the true seal still counts
    assert CountingLines.lookups <= 2 * len(ring.lines)


@pytest.mark.parametrize(
    "payload",
    [
        b"1|100000000000000000000|zz",  # 10**20: beyond any id a backend gives
        b"1|9223372036854775808|zz",  # 2**63
        b"-5|3|zz",
        b"0|3|zz",
        b"3|-1|zz",
        b"5|3|zz",
        b"+1|3|zz",
        b" 1|3|zz",
        b"1_0|20|zz",
        "\u0661|\u0663|zz".encode(),  # Arabic-Indic digits: int() takes them as str
        b"9" * 5000 + b"|1|zz",  # int() refuses past 4,300 digits with a ValueError; quadratic below
        b"1|2|",
        b"1|2|" + b"f" * 129,
        b"1|2",
        b"garbage",
        b"",
    ],
)
def test_seal_of_takes_only_ids_as_the_backends_write_them(payload: bytes) -> None:
    from shmbus.adapters.bridge.seals import seal_of

    assert seal_of(payload) is None


def test_ids_are_ascii_digits_within_63_bits() -> None:
    from shmbus.adapters.bridge.seals import seal_of
    from shmbus.adapters.bridge.wire import MAX_ID, parse_id, parse_line

    assert parse_id(b"1") == 1 and parse_id(str(MAX_ID).encode()) == MAX_ID
    for bad in (b"", b"0", b"-1", b"+1", b" 1", b"1 ", b"1_0", "٣".encode(), str(MAX_ID + 1).encode(), b"9" * 5000):
        assert parse_id(bad) is None, bad
    assert seal_of(b"5|7|" + b"f" * 40) == (5, 7, b"f" * 40)
    for bad_line in (b"-1|1|/c|{}", b"1|+1|/c|{}", b"1_0|1|/c|{}", b"9" * 5000 + b"|1|/c|{}"):
        assert parse_line(bad_line) is None, bad_line
