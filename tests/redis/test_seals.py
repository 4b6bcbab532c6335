"""The bridge kit's seal check on its own (no server): which rows a ring's seals vouch for."""

from __future__ import annotations

import pytest

from shmbus.adapters.bridge.rows import Ring
from shmbus.adapters.bridge.seals import Sealer, mac, sealed_rows

KEY, HISTORY = b"k" * 64, 42


def line(gid: int, data: str) -> bytes:
    return b'%d|%d|/c|{"data":"%s"}' % (gid, gid, data.encode())


def ids(ring: Ring, after: int) -> list[int]:
    return [row.global_id for row in sealed_rows(ring, Sealer("sha1", KEY, HISTORY), after)]


def test_a_run_is_taken_whole_and_only_after_the_position() -> None:
    run = [line(g, f"m{g}") for g in (5, 6, 7)]
    ring = Ring(7, run, {5: (7, mac("sha1", KEY, HISTORY, run))})
    assert ids(ring, 4) == [5, 6, 7]
    assert ids(ring, 6) == [7]  # 5 and 6 stored already
    assert ids(ring, 3) == []  # 4 is missing: the read decides
    assert ids(Ring(7, run[:2], ring.seals), 4) == []  # a line of the run never came


def test_runs_in_any_order_verify_each_and_stop_at_the_first_that_does_not() -> None:
    one, two = [line(5, "a"), line(6, "b")], [line(7, "c")]
    seals = {7: (7, mac("sha1", KEY, HISTORY, two)), 5: (6, mac("sha1", KEY, HISTORY, one))}
    assert ids(Ring(7, [two[0], one[1], one[0]], seals), 4) == [5, 6, 7]
    forged = {**seals, 7: (7, mac("sha1", KEY, HISTORY + 1, two))}  # another history
    assert ids(Ring(7, [*one, *two], forged), 4) == [5, 6]


def test_the_same_bytes_cut_into_other_lines_do_not_verify() -> None:
    """Each line enters the seal with its length: a writer's envelope that looks like a line cannot be split off as
    one (the forged cut below concatenates to the very bytes the backend sealed)."""
    real = [line(5, "x6|6|/c|evil"), line(6, "b")]
    cut = [real[0][: real[0].index(b"6|6|")], real[0][real[0].index(b"6|6|") :] + real[1]]
    assert b"".join(cut) == b"".join(real)
    tag = mac("sha1", KEY, HISTORY, real)
    assert ids(Ring(6, real, {5: (6, tag)}), 4) == [5, 6]
    assert ids(Ring(6, cut, {5: (6, tag)}), 4) == []


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
    from shmbus.adapters.bridge.seals import parse_line

    assert parse_line(b'12|3|/a$$123$$b|{"data":1}') == (12, 3, "/a|b", b'{"data":1}')
    assert parse_line(b"12|3|/a|x|y|") == (12, 3, "/a", b"x|y|")  # the envelope is everything after the third |
    for bad in (b"", b"12", b"12|3", b"12|3|/a", b"12|3|/a|", b"x|3|/a|{}", b"12|y|/a|{}", b"1|2|\xff|{}"):
        assert parse_line(bad) is None, bad
