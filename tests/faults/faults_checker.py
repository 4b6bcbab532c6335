"""THE checker of the fault suite: one verdict for every scenario, on every host.

The promise (issue 22): every acknowledged publish (``publish`` returned an id) appears exactly once, in order per
channel, on every host (its live subscriber AND its channel backlogs), or the host reports it lost. Reported means:

- **gap**: the host's channel backlog says ``gap=True`` across the message (read where a client of the host
  stands, at the newest message before it that the host delivered: ``backlog(channel, previous)`` has
  ``first_available`` beyond the message's id), and
- the host's ``relay_lost`` (host-wide, from the segment's figures) counts at least what its live subscriber
  missed; or
- **reset**: the message belongs to a history the backend no longer has (the scenario wiped it: FLUSHDB,
  TRUNCATE, a Redis crash without persistence) and the host reset its bus (a new epoch) since.

And no reset without a real history change: a host's resets never outnumber the scenario's wipes.

Everything else is a failure: ``lost silently`` (missing with nothing said, or a hole in a backlog the live
subscriber did see with ``gap=False``), ``duplicates`` (one payload delivered twice, or held twice in a backlog;
a second delivery in a later epoch after a justified reset is the new epoch's re-read: shown as ``redelivered``,
allowed), ``injected`` (delivered but never published: a forged notice), ``disorder`` (ids not increasing per
channel within an epoch) and ``wrong id`` (delivered under another id than its publisher was given).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from shmbus.metrics import read_snapshot

from .faults_hosts import CHANNELS, SENTINEL, Cluster, Host

__all__ = ["HostVerdict", "Verdict", "check"]


@dataclass
class HostVerdict:
    label: str
    delivered: int = 0
    lost_reported: int = 0
    lost_silently: int = 0
    duplicates: int = 0
    injected: int = 0
    disorder: int = 0
    wrong_id: int = 0
    refused_delivered: int = 0  # delivered though its publish raised a definite error (a caller would retry it)
    resets: int = 0
    redelivered: int = 0  # delivered again after a justified reset (the new epoch's re-read)
    relay_lost: int = 0
    notes: list[str] = field(default_factory=list)


@dataclass
class Verdict:
    scenario: str
    acknowledged: int
    wipes: int
    hosts: list[HostVerdict]
    errors: dict[str, int]

    def problems(self) -> list[str]:
        out = []
        for h in self.hosts:
            for what in ("lost_silently", "duplicates", "injected", "disorder", "wrong_id", "refused_delivered"):
                if getattr(h, what):
                    out.append(f"host {h.label}: {getattr(h, what)} {what.replace('_', ' ')}")
            if h.resets > self.wipes:
                out.append(f"host {h.label}: {h.resets} resets, but the backend's history changed {self.wipes} times")
            out += [f"host {h.label}: {note}" for note in h.notes]
        return out

    def row(self) -> dict[str, Any]:
        """The table's row (see the root conftest's terminal summary)."""
        return {
            "scenario": self.scenario,
            "acknowledged": self.acknowledged,
            "delivered": " ".join(f"{h.label}={h.delivered}" for h in self.hosts),
            "lost reported": sum(h.lost_reported for h in self.hosts),
            "lost silently": sum(h.lost_silently for h in self.hosts),
            "duplicates": sum(h.duplicates for h in self.hosts),
            "resets": " ".join(f"{h.label}={h.resets}" for h in self.hosts) + f" (wipes {self.wipes})",
            "other": ", ".join(
                f"{h.label}:{w}={getattr(h, w)}"
                for h in self.hosts
                for w in ("injected", "disorder", "wrong_id", "refused_delivered")
                if getattr(h, w)
            ),
        }


def check(cluster: Cluster, scenario: str, channels: tuple[str, ...] = CHANNELS) -> Verdict:
    """Judge every host of ``cluster`` (after :meth:`Cluster.settle`)."""
    ledger = cluster.ledger
    verdict = Verdict(scenario, len(ledger.acks), ledger.wipes, [], dict(ledger.errors))
    # every host is judged on what was acknowledged from its start on (a host that starts later owes nothing older)
    for host in cluster.hosts:
        verdict.hosts.append(_check_host(cluster, host, (*channels, SENTINEL)))
    return verdict


def _check_host(cluster: Cluster, host: Host, channels: tuple[str, ...]) -> HostVerdict:
    ledger = cluster.ledger
    final = ledger.gen
    v = HostVerdict(host.label, resets=host.resets)
    acks = {a.payload: a for a in ledger.acks}
    owed = ledger.acks[host.born :]

    # the live subscriber: each payload once, ids increasing per channel within an epoch, the publisher's ids
    live = Counter(r[4] for r in host.received)
    # a second delivery in a later epoch, after a justified reset, is the reset's re-read (explained); any other
    # second delivery is a duplicate
    justified = host.resets <= ledger.wipes
    epochs_of: dict[Any, list[int]] = {}
    for r in host.received:
        epochs_of.setdefault(r[4], []).append(r[0])
    for seen in epochs_of.values():
        again = len(seen) - 1
        if again and justified and len(set(seen)) == len(seen):
            v.redelivered += again
        else:
            v.duplicates += again
    injected = [p for p in live if p not in ledger.tried]
    v.injected += len(injected)
    if injected:
        v.notes.append(f"delivered, never published: {injected[:3]}")
    newest: dict[tuple[int, str], int] = {}
    for epoch, channel, mid, gid, data in host.received:
        key = (epoch, channel)
        if mid <= newest.get(key, 0):
            v.disorder += 1
            v.notes.append(f"live disorder in epoch {epoch} on {channel}: id {mid} (global {gid}) after {newest[key]}")
        newest[key] = mid
        a = acks.get(data)
        if a is not None and a.mid != mid and a.gen_lo == a.gen_hi == final:
            v.wrong_id += 1

    # the channel backlogs, as any reader of the host gets them (engines may fill gaps from the backend)
    bus = host.bus
    assert bus is not None, f"host {host.label} is down at the check"
    held: Counter[Any] = Counter()
    seen: dict[str, list[int]] = {}  # ids the live subscriber got in the current epoch, per channel
    for epoch, channel, mid, _gid, _data in host.received:
        if epoch == bus.epoch:
            seen.setdefault(channel, []).append(mid)
    gap_across: set[str] = set()
    why: dict[str, str] = {}  # what the host's backlog said about a message it does not hold
    for channel in channels:
        backlog = bus.backlog(channel, 0)
        ids = [m.message_id for m in backlog]
        if ids != sorted(set(ids)):
            v.disorder += 1
            v.notes.append(f"backlog of {channel} out of order or repeated: {ids[:40]}")
        held.update(m.data for m in backlog)
        v.injected += sum(1 for m in backlog if m.data not in ledger.tried)
        reads: dict[int, Any] = {}
        for a in owed:
            if a.channel != channel or a.payload in held or a.gen_lo != final:
                continue
            # where a client of this host stands: the newest message before it that the host delivered
            before = max((i for i in (*ids, *seen.get(channel, ())) if i < a.mid), default=0)
            if before not in reads:
                reads[before] = bus.backlog(channel, before)
            part = reads[before]
            if any(m.data == a.payload for m in part):
                held[a.payload] += 1
            elif part.gap and part.first_available > a.mid:
                gap_across.add(a.payload)
            else:
                why[a.payload] = (
                    f"backlog({channel!r}, {before}): gap={part.gap}, first_available={part.first_available}"
                )
    v.duplicates += sum(n - 1 for n in held.values() if n > 1)
    refused = ledger.refused & (set(live) | set(held))
    v.refused_delivered = len(refused)
    if refused:
        v.notes.append(f"delivered though publish raised a definite error: {sorted(refused)[:3]}")

    v.relay_lost = read_snapshot(bus, channels=False).total("relay_lost")
    live_missed = 0
    holes: list[str] = []
    silent: list[str] = []
    for a in owed:
        reset_covers = a.gen_lo < final and host.resets > 0
        if a.payload not in live and not reset_covers:
            live_missed += 1
        if a.payload in live or a.payload in held:
            v.delivered += 1
            if a.payload not in held and a.gen_lo == final and a.payload not in gap_across:
                holes.append(f"{a.payload} id {a.mid} ({why.get(a.payload, '-')})")  # the backlog lost it, no gap
            continue
        if reset_covers or a.payload in gap_across:
            v.lost_reported += 1
        else:
            v.lost_silently += 1
            silent.append(f"{a.payload} on {a.channel} id {a.mid} ({why.get(a.payload, '-')})")
    if silent:
        v.notes.append(f"missing with no gap and no reset: {len(silent)}, e.g. {', '.join(silent[:3])}")
    if holes:
        v.notes.append(
            f"{len(holes)} message(s) its subscriber saw are missing from its backlogs without gap=True, "
            f"e.g. {', '.join(holes[:2])}"
        )
    unreported_live = max(live_missed - v.relay_lost, 0)
    if unreported_live > v.lost_silently + len(holes):
        v.notes.append(f"its live subscriber missed {live_missed} but relay_lost says {v.relay_lost}")
    v.lost_silently = max(v.lost_silently + len(holes), unreported_live)
    return v
