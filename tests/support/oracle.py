"""The invariant oracle over the sim GPU ledger (see :mod:`hotseat_sim.timeline`).

One verdict for any fault test or soak run::

    verdict = judge(await read_timeline(redis, Keys(prefix), "gpu0"))
    assert verdict.ok, verdict

- no two members hold the GPU at once (``overlaps``);
- no load is even attempted while another member holds it (``oom``: the ledger refused a
  load that would not fit beside the resident);
- no request is served by a member that is not ready (``served_while_not_resident``);
- no request reaches a member that is not ready (``refused``: the sim answered 503 because
  a router dispatched to a member that was loading, unloading or gone).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from hotseat_common.keys import Keys
from hotseat_sim.timeline import (
    LedgerEntry,
    LedgerEvent,
    Overlap,
    overlaps,
    read_timeline,
    refused_requests,
    served_while_not_resident,
)


@dataclass(frozen=True, slots=True)
class Verdict:
    entries: int
    loads: int
    overlaps: tuple[Overlap, ...]
    oom: tuple[LedgerEntry, ...]
    served_while_not_resident: tuple[LedgerEntry, ...]
    refused: tuple[LedgerEntry, ...]

    @property
    def violations(self) -> int:
        return (
            len(self.overlaps)
            + len(self.oom)
            + len(self.served_while_not_resident)
            + len(self.refused)
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
        }


def judge(timeline: Sequence[LedgerEntry]) -> Verdict:
    """Every ledger violation in ``timeline``."""
    return Verdict(
        entries=len(timeline),
        loads=sum(1 for e in timeline if e.event is LedgerEvent.LOAD_START),
        overlaps=tuple(overlaps(timeline)),
        oom=tuple(e for e in timeline if e.event is LedgerEvent.OOM),
        served_while_not_resident=tuple(served_while_not_resident(timeline)),
        refused=tuple(refused_requests(timeline)),
    )


async def judge_gpu(redis_url: str, prefix: str, gpu: str = "gpu0") -> Verdict:
    """Read ``gpu``'s ledger (key prefix ``prefix``) and judge it."""
    client: aioredis.Redis = aioredis.from_url(redis_url, decode_responses=True)
    try:
        return judge(await read_timeline(client, Keys(prefix), gpu))
    finally:
        await client.aclose()


async def assert_gpu_invariants(redis_url: str, prefix: str, gpu: str = "gpu0") -> Verdict:
    verdict = await judge_gpu(redis_url, prefix, gpu)
    assert verdict.ok, f"ledger of {gpu} violates the invariants: {verdict}"
    return verdict
