"""The invariant oracle over the sim GPU ledger (see :mod:`hotseat_sim.timeline`).

One verdict for any fault test or soak run::

    verdict = judge(await read_timeline(redis, Keys(prefix), "gpu0"))
    assert verdict.ok, verdict

- no two members hold the GPU at once (``overlaps``); in a capacity pool (docs/adr/0008,
  ``capacity_gib`` given) several may, and instead the memory of the members loading,
  resident or unloading never exceeds the capacity (``over_capacity``, recomputed from the
  ledger's declared sizes);
- no load is even attempted while another member holds it (``oom``: the ledger refused a
  load that would not fit beside the resident);
- no request is served by a member that is not ready (``served_while_not_resident``);
- no request reaches a member that is not ready (``refused``: the sim answered 503 because
  a router dispatched to a member that was loading, unloading or gone);
- no member is unloaded while it serves (``unloaded_while_serving``), and no request is cut
  by an unload, a crash or a restart of its member (``cut``). The one excuse is explicit and
  counted apart (``excused``): a request the test names, because its router died or froze
  past its lease, so that the lease expired and the member was rightly free to go;
- the ledger is whole: no entry a sim failed to write (``lost_writes``: a gap in a sim's
  sequence; ``write_failures``: the failures a live sim counted, which also catches a
  failed last write that no later entry shows as a gap), and not empty (a verdict over
  nothing proves nothing: ``empty``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from hotseat_common.keys import Keys
from hotseat_sim.timeline import (
    Cut,
    LedgerEntry,
    LedgerEvent,
    Overlap,
    cuts,
    lost_writes,
    over_capacity,
    overlaps,
    read_timeline,
    refused_requests,
    served_while_not_resident,
    unloaded_while_serving,
)


@dataclass(frozen=True, slots=True)
class Verdict:
    entries: int
    loads: int
    overlaps: tuple[Overlap, ...]
    oom: tuple[LedgerEntry, ...]
    served_while_not_resident: tuple[LedgerEntry, ...]
    refused: tuple[LedgerEntry, ...]
    unloaded_while_serving: tuple[LedgerEntry, ...] = ()
    cut: tuple[Cut, ...] = ()
    excused: tuple[Cut, ...] = ()
    """Cuts of requests the caller named (their router died or froze past its lease)."""
    lost_writes: tuple[tuple[str, int], ...] = ()
    over_capacity: tuple[LedgerEntry, ...] = ()
    """Loads after which the members holding memory exceeded a capacity pool's capacity."""
    write_failures: int = 0
    """Ledger writes the live sims of this GPU counted as failed (``/control/state``)."""

    @property
    def empty(self) -> bool:
        return self.entries == 0

    @property
    def violations(self) -> int:
        return (
            len(self.overlaps)
            + len(self.oom)
            + len(self.served_while_not_resident)
            + len(self.refused)
            + len(self.unloaded_while_serving)
            + len(self.cut)
            + len(self.lost_writes)
            + len(self.over_capacity)
            + self.write_failures
            + int(self.empty)
        )

    @property
    def ok(self) -> bool:
        return self.violations == 0

    def summary(self) -> dict[str, int]:
        return {
            "entries": self.entries,
            "loads": self.loads,
            "overlaps": len(self.overlaps),
            "oom": len(self.oom),
            "served_while_not_resident": len(self.served_while_not_resident),
            "refused": len(self.refused),
            "unloaded_while_serving": len(self.unloaded_while_serving),
            "cut": len(self.cut),
            "excused": len(self.excused),
            "lost_writes": len(self.lost_writes),
            "over_capacity": len(self.over_capacity),
            "write_failures": self.write_failures,
        }


def judge(
    timeline: Sequence[LedgerEntry],
    *,
    excused: Collection[str] = (),
    capacity_gib: float | None = None,
) -> Verdict:
    """Every ledger violation in ``timeline``; cuts of the request ids in ``excused`` are
    counted apart instead (an unload still counts when it cut any other request).
    ``capacity_gib``: the GPU is a capacity pool's, where members share it within that
    memory (overlaps are allowed, going over it is not)."""
    every_cut = cuts(timeline)
    pardoned = tuple(c for c in every_cut if c.request_id and c.request_id in excused)
    unpardoned = tuple(c for c in every_cut if c not in pardoned)
    guilty_unloads = {c.by.id for c in unpardoned}
    return Verdict(
        entries=len(timeline),
        loads=sum(1 for e in timeline if e.event is LedgerEvent.LOAD_START),
        overlaps=() if capacity_gib is not None else tuple(overlaps(timeline)),
        over_capacity=(
            tuple(over_capacity(timeline, capacity_gib)) if capacity_gib is not None else ()
        ),
        oom=tuple(e for e in timeline if e.event is LedgerEvent.OOM),
        served_while_not_resident=tuple(served_while_not_resident(timeline)),
        refused=tuple(refused_requests(timeline)),
        unloaded_while_serving=tuple(
            e for e in unloaded_while_serving(timeline) if e.id in guilty_unloads
        ),
        cut=unpardoned,
        excused=pardoned,
        lost_writes=tuple(lost_writes(timeline)),
    )


async def judge_gpu(
    redis_url: str,
    prefix: str,
    gpu: str = "gpu0",
    *,
    excused: Collection[str] = (),
    capacity_gib: float | None = None,
) -> Verdict:
    """Read ``gpu``'s ledger (key prefix ``prefix``) and judge it."""
    client: aioredis.Redis = aioredis.from_url(redis_url, decode_responses=True)
    try:
        timeline = await read_timeline(client, Keys(prefix), gpu)
        return judge(timeline, excused=excused, capacity_gib=capacity_gib)
    finally:
        await client.aclose()


async def assert_gpu_invariants(
    redis_url: str,
    prefix: str,
    gpu: str = "gpu0",
    *,
    excused: Collection[str] = (),
    capacity_gib: float | None = None,
) -> Verdict:
    verdict = await judge_gpu(redis_url, prefix, gpu, excused=excused, capacity_gib=capacity_gib)
    assert verdict.ok, f"ledger of {gpu} violates the invariants: {verdict.summary()} {verdict}"
    return verdict
