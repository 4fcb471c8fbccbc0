"""The simulated GPU's residency timeline and the checks tests run on it.

Every sim on one simulated GPU appends to the same Redis stream
(:meth:`hotseat_common.keys.Keys.sim_ledger`): loads, unloads, out-of-memory refusals and
the requests it serves. The stream's entry ids are Redis timestamps, so the entries of
several sims are totally ordered by one clock.

Residency of a member runs from its ``load_start`` (memory reserved) to its ``unloaded``
(memory released); it is *ready* to serve from ``loaded`` to ``unload_start``. The
checks are pure functions of a timeline::

    timeline = await read_timeline(redis, Keys(prefix), "gpu0")
    assert overlaps(timeline) == []
    assert served_while_not_resident(timeline) == []
    assert cuts(timeline) == []

A request is *in flight* on its member from its ``serve_start`` to its ``serve_end``
(told apart by the sim's ``ticket``, never by the client's request id, which a client may
repeat). An ``unload_start`` of the member while requests are in flight cuts them (the
controller unloaded a member that was serving); so does an ``unloaded`` that a crash, a
restart or a shutdown of the sim wrote. Each entry's ``boot`` and ``seq`` let
:func:`lost_writes` find entries a sim failed to write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import redis.asyncio as aioredis

from hotseat_common.keys import Keys

__all__ = [
    "Cut",
    "LedgerEntry",
    "LedgerEvent",
    "Overlap",
    "Residency",
    "cuts",
    "lost_writes",
    "over_capacity",
    "overlaps",
    "read_timeline",
    "refused_requests",
    "residencies",
    "served_while_not_resident",
    "unloaded_while_serving",
]

_PAGE = 1000


class LedgerEvent(StrEnum):
    LOAD_START = "load_start"
    """Admitted: the member's memory is reserved and loading begins."""
    LOADED = "loaded"
    """Loading finished: the member serves."""
    UNLOAD_START = "unload_start"
    """The member stops serving and begins to unload."""
    UNLOADED = "unloaded"
    """The member's memory is released (unload done, a failed load, a crash or a restart)."""
    OOM = "oom"
    """A load was refused: it would have exceeded the GPU's memory."""
    SERVE_START = "serve_start"
    """A request took a slot and began generating."""
    SERVE_END = "serve_end"
    """A request ended (``outcome``: completed, disconnected or aborted)."""
    SERVE_REFUSED = "serve_refused"
    """A request arrived while the member was not ready and got 503."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    id: str
    """The stream entry id (``<ms>-<seq>``, Redis clock)."""
    event: LedgerEvent
    member: str
    fields: Mapping[str, str] = field(default_factory=dict)

    @property
    def time(self) -> float:
        """When the entry was appended, in seconds since the epoch (Redis clock)."""
        ms, _, _ = self.id.partition("-")
        return int(ms) / 1000.0

    @classmethod
    def of(
        cls, event: LedgerEvent | str, member: str, entry_id: str = "0-0", **fields: str
    ) -> LedgerEntry:
        """An entry built by hand (pure tests of the checks)."""
        return cls(entry_id, LedgerEvent(event), member, fields)


@dataclass(frozen=True, slots=True)
class Residency:
    """One member's memory on the GPU: from ``load_start`` to ``unloaded`` (None: still)."""

    member: str
    start: LedgerEntry
    end: LedgerEntry | None


@dataclass(frozen=True, slots=True)
class Overlap:
    """Two members held the GPU at once: ``second`` started loading while ``first`` held it."""

    first: str
    second: str
    at: LedgerEntry


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _entry(entry_id: Any, raw: Mapping[Any, Any]) -> LedgerEntry | None:
    fields = {_text(k): _text(v) for k, v in raw.items()}
    event = fields.pop("event", "")
    member = fields.pop("member", "")
    try:
        kind = LedgerEvent(event)
    except ValueError:
        return None
    return LedgerEntry(_text(entry_id), kind, member, fields)


async def read_timeline(redis: aioredis.Redis, keys: Keys, gpu: str) -> list[LedgerEntry]:
    """Every entry of ``gpu``'s ledger, oldest first (works with or without decoded replies)."""
    stream = keys.sim_ledger(gpu)
    out: list[LedgerEntry] = []
    start = "-"
    while True:
        page = await redis.xrange(stream, min=start, max="+", count=_PAGE) or []
        for entry_id, raw in page:
            entry = _entry(entry_id, raw or {})
            if entry is not None:
                out.append(entry)
        if len(page) < _PAGE:
            return out
        start = "(" + _text(page[-1][0])


def residencies(timeline: Iterable[LedgerEntry]) -> list[Residency]:
    """Each member's residency intervals in order of their start."""
    open_: dict[str, LedgerEntry] = {}
    done: list[Residency] = []
    for entry in timeline:
        if entry.event is LedgerEvent.LOAD_START:
            previous = open_.pop(entry.member, None)
            if previous is not None:  # a second load_start without unloaded: keep both visible
                done.append(Residency(entry.member, previous, None))
            open_[entry.member] = entry
        elif entry.event is LedgerEvent.UNLOADED:
            start = open_.pop(entry.member, None)
            if start is not None:
                done.append(Residency(entry.member, start, entry))
    done.extend(Residency(member, start, None) for member, start in open_.items())
    return sorted(done, key=lambda r: _order(r.start.id))


def _order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def overlaps(timeline: Sequence[LedgerEntry]) -> list[Overlap]:
    """Residencies of different members that intersect (empty when never two residents)."""
    holding: dict[str, LedgerEntry] = {}
    found: list[Overlap] = []
    for entry in timeline:
        if entry.event is LedgerEvent.LOAD_START:
            found.extend(
                Overlap(other, entry.member, entry) for other in holding if other != entry.member
            )
            holding[entry.member] = entry
        elif entry.event is LedgerEvent.UNLOADED:
            holding.pop(entry.member, None)
    return found


def over_capacity(timeline: Sequence[LedgerEntry], capacity_gib: float) -> list[LedgerEntry]:
    """``load_start`` entries after which the members holding memory (loading, resident or
    unloading, from each ``load_start`` to its ``unloaded``) declared more than
    ``capacity_gib`` together: recomputed from the ledger, not taken from the admission."""
    holding: dict[str, float] = {}
    found: list[LedgerEntry] = []
    for entry in timeline:
        if entry.event is LedgerEvent.LOAD_START:
            holding[entry.member] = float(entry.fields.get("gib") or 0)
            if sum(holding.values()) > capacity_gib + 1e-9:
                found.append(entry)
        elif entry.event is LedgerEvent.UNLOADED:
            holding.pop(entry.member, None)
    return found


def served_while_not_resident(timeline: Sequence[LedgerEntry]) -> list[LedgerEntry]:
    """``serve_start`` entries of a member that was not ready (between loaded and unload)."""
    ready: set[str] = set()
    found: list[LedgerEntry] = []
    for entry in timeline:
        if entry.event is LedgerEvent.LOADED:
            ready.add(entry.member)
        elif entry.event in {
            LedgerEvent.UNLOAD_START,
            LedgerEvent.UNLOADED,
            LedgerEvent.LOAD_START,
        }:
            ready.discard(entry.member)
        elif entry.event is LedgerEvent.SERVE_START and entry.member not in ready:
            found.append(entry)
    return found


def refused_requests(timeline: Sequence[LedgerEntry]) -> list[LedgerEntry]:
    """Requests that reached a member while it was not ready (a router dispatched too early)."""
    return [e for e in timeline if e.event is LedgerEvent.SERVE_REFUSED]


@dataclass(frozen=True, slots=True)
class Cut:
    """A request still in flight when its member's memory was taken away."""

    request: LedgerEntry
    """Its ``serve_start``."""
    by: LedgerEntry
    """The ``unload_start`` (or the ``unloaded`` of a crash, restart or shutdown) that cut it."""

    @property
    def request_id(self) -> str:
        return self.request.fields.get("request_id", "")

    @property
    def cause(self) -> str:
        """``unload`` when the controller unloaded it, else the sim's reason (``crash`` ...)."""
        if self.by.event is LedgerEvent.UNLOAD_START:
            return "unload"
        return self.by.fields.get("reason", "unloaded")


def _serve_key(entry: LedgerEntry) -> tuple[str, str]:
    """Which request an entry is about: the sim's own ticket (client ids may repeat)."""
    ticket = entry.fields.get("ticket")
    if ticket is not None:
        return entry.fields.get("boot", ""), ticket
    return "", entry.fields.get("request_id", entry.id)  # entries written before tickets


def cuts(timeline: Sequence[LedgerEntry]) -> list[Cut]:
    """Every request cut by an unload (or a crash, restart or shutdown) of its member."""
    in_flight: dict[str, dict[tuple[str, str], LedgerEntry]] = {}
    found: list[Cut] = []
    for entry in timeline:
        serving = in_flight.setdefault(entry.member, {})
        if entry.event is LedgerEvent.SERVE_START:
            serving[_serve_key(entry)] = entry
        elif entry.event is LedgerEvent.SERVE_END:
            serving.pop(_serve_key(entry), None)
        elif entry.event in {LedgerEvent.UNLOAD_START, LedgerEvent.UNLOADED}:
            found.extend(Cut(request, entry) for request in serving.values())
            serving.clear()
    return found


def unloaded_while_serving(timeline: Sequence[LedgerEntry]) -> list[LedgerEntry]:
    """The ``unload_start`` entries of a member that had requests in flight."""
    seen: dict[str, LedgerEntry] = {}
    for cut in cuts(timeline):
        if cut.by.event is LedgerEvent.UNLOAD_START:
            seen.setdefault(cut.by.id, cut.by)
    return sorted(seen.values(), key=lambda e: _order(e.id))


def lost_writes(timeline: Sequence[LedgerEntry]) -> list[tuple[str, int]]:
    """``(boot, seq)`` of every entry a sim numbered but the ledger does not hold (a write
    that failed), after the first entry of each sim process the ledger still keeps."""
    seqs: dict[str, list[int]] = {}
    for entry in timeline:
        boot, seq = entry.fields.get("boot"), entry.fields.get("seq")
        if boot is not None and seq is not None and seq.isdigit():
            seqs.setdefault(boot, []).append(int(seq))
    missing: list[tuple[str, int]] = []
    for boot, numbers in seqs.items():
        present = set(numbers)
        missing.extend((boot, n) for n in range(min(present), max(present)) if n not in present)
    return missing
