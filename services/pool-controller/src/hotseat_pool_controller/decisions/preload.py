"""Preload (a capacity pool's ``preload`` members, docs/adr/0008): loaded as a controller
starts, when they fit.

The default and pinned members are *kept* resident (loaded at start and again after a
loss); a preload member is only loaded once per controller start, beside the residents
and without evicting any of them, and from then on is a member like any other: evicted
for demand, unloaded when idle for its ``idleUnloadAfter``. The controller keeps the
members still to preload (in memory: every controller that starts preloads afresh); a
member leaves that set once it is resident, once it failed to load, or once the pool is
quiet and it does not fit. Preloading never goes before a request: it only moves a pool
that nothing else moves (no plan in flight, nobody waiting).
"""

from __future__ import annotations

from dataclasses import dataclass

from hotseat_common.messages import SwapReason
from hotseat_pool_controller.decisions.capacity import Plan, free_gib, start_plan
from hotseat_pool_controller.model import (
    IN_FLIGHT,
    NOTHING,
    Decision,
    Phase,
    PoolPolicy,
    PoolSnapshot,
)


@dataclass
class Preloads:
    """What this controller preloads (it keeps them in memory, as it started them):
    ``pending``, the members still to preload; ``loaded``, those its preload loaded and
    that have stayed resident since, as far as it has seen (a member evicted and loaded
    again for demand between two of its reads of the pool would still count)."""

    pending: tuple[str, ...]
    loaded: frozenset[str] = frozenset()

    def seen(self, snap: PoolSnapshot) -> None:
        """A member preloaded stops counting once it is neither resident nor loading."""
        self.loaded = frozenset(
            m
            for m in self.loaded
            if m in snap.residents or (snap.phase in IN_FLIGHT and snap.target == m)
        )

    def started(self, decision: Decision) -> None:
        """``decision`` (of ``decide_preload``) was applied: its member is preloading."""
        if decision.swap is not None:
            self.loaded |= {decision.swap.target}


def _quiet(snap: PoolSnapshot, policy: PoolPolicy) -> bool:
    """Nothing else moves the pool: no plan in flight or left over, nobody waiting, not
    emptied by an operator."""
    return (
        snap.phase == Phase.IDLE
        and not snap.parked
        and not snap.evicts
        and not snap.unwell
        and not any(snap.live_waiters(m) for m in policy.members)
    )


def _fits(snap: PoolSnapshot, policy: PoolPolicy, member: str) -> bool:
    return policy.gib(member) <= free_gib(snap, policy) + 1e-9


def preload_left(
    snap: PoolSnapshot, policy: PoolPolicy, pending: tuple[str, ...]
) -> tuple[str, ...]:
    """The members of ``pending`` still to preload: not resident, not failed, and, once
    the pool is quiet, fitting beside the residents."""
    if not policy.has_capacity:
        return ()
    quiet = _quiet(snap, policy)
    return tuple(
        m
        for m in pending
        if m not in snap.residents
        and snap.failures.get(m, 0) <= 0
        and (not quiet or _fits(snap, policy, m))
    )


def decide_preload(
    snap: PoolSnapshot, policy: PoolPolicy, controller: str, pending: tuple[str, ...]
) -> Decision:
    """Load the first member of ``pending`` that fits beside the residents, when the pool
    is quiet (nothing evicted; reason ``preload``)."""
    if not policy.has_capacity or not _quiet(snap, policy):
        return NOTHING
    for member in preload_left(snap, policy, pending):
        start = start_plan(
            snap, policy, controller, Plan(member, ()), reason=SwapReason.PRELOAD, forced=True
        )
        return start.decision()
    return NOTHING
