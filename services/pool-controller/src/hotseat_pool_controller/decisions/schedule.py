"""The scheduler's judgements (docs/adr/0006): who goes next, when the resident closes to
new requests, how soon a request can be served at the earliest, when a resident has been
idle long enough to go. Pure functions of a snapshot; the acquire and tick decisions use
them."""

from __future__ import annotations

import math
from collections.abc import Iterable

from hotseat_pool_controller.model import (
    IN_FLIGHT,
    SERVING,
    Phase,
    PoolPolicy,
    PoolSnapshot,
    RecordDrainTime,
    SetState,
)
from hotseat_pool_controller.store.codec import Keep, set_state

MIN_RESIDENCY_FLOOR_MS = 1000
MIN_RESIDENCY_SWAPS = 2
"""Unset ``minResidency``: this many mean measured swap times (at least the floor)."""


def _mean(values: tuple[float, ...]) -> float | None:
    return sum(values) / len(values) if values else None


def swap_s(snap: PoolSnapshot, member: str | None) -> float | None:
    """The measured time of a swap to ``member``, from its own recent swaps; ``None``
    before one was measured (another member's load says nothing about this one's, and
    the estimate must never refuse on a guess)."""
    return _mean(snap.member_swap_times.get(member, ())) if member else None


def drain_s(snap: PoolSnapshot, member: str | None) -> float:
    """How long ``member`` is expected to take to drain once closed: the longest of its
    recent measured drains (from its close to its last lease's end) and of its recent
    requests (a stream granted just before the close runs its whole length: a high
    percentile, not the mean). 0 before either was measured: the close then waits for
    ``maxWait`` itself, as it always did."""
    if member is None:
        return 0.0
    drains = snap.member_drain_times.get(member, ())
    requests = snap.member_request_times.get(member, ())
    return max((*drains, *requests), default=0.0)


def ranked(
    snap: PoolSnapshot, *, excluding: str | None = None, among: frozenset[str] | None = None
) -> list[str]:
    """Members with live waiters, most urgent first (earliest virtual arrival; a member
    whose waiters carry no urgency, written before it existed, ranks by now); ``among``:
    only those members."""
    waiting = [
        m
        for m, n in snap.waiters.items()
        if n > 0 and m != excluding and (among is None or m in among)
    ]
    return sorted(waiting, key=lambda m: (snap.urgency.get(m, snap.now_ms), m))


def most_urgent(
    snap: PoolSnapshot, *, excluding: str | None = None, among: frozenset[str] | None = None
) -> str | None:
    order = ranked(snap, excluding=excluding, among=among)
    return order[0] if order else None


def ranks_ahead(snap: PoolSnapshot, member: str, other: str) -> bool:
    """``member``'s most urgent waiter ranks strictly ahead of ``other``'s (an earlier
    virtual arrival): it came with a higher priority than ``other``'s demand, or was in
    line first."""
    return snap.urgency.get(member, snap.now_ms) < snap.urgency.get(other, snap.now_ms)


def retarget_for(snap: PoolSnapshot, policy: PoolPolicy) -> str | None:
    """The member a one-resident pool's swap, still unloading, loads instead of its
    target: the most urgent waiting member, when its most urgent waiter ranks strictly
    ahead of the target's (a request of higher priority came after the swap began);
    ``None``: the swap keeps its target. A forced or unload-only swap keeps it (an
    operator named it), a target whose demand left is cancelled instead, a member in its
    failure backoff is passed over, and a capacity pool's plan keeps its target (its
    evicts were chosen to make room for that one)."""
    target = snap.target
    if policy.has_capacity or snap.phase != Phase.UNLOADING or snap.forced or target is None:
        return None
    if snap.live_waiters(target) == 0:
        return None
    for member in ranked(snap, excluding=target):
        if snap.failures.get(member, 0) > 0:
            continue
        return member if ranks_ahead(snap, member, target) else None
    return None


def min_residency_ms(snap: PoolSnapshot, policy: PoolPolicy) -> int:
    if policy.min_residency_ms is not None:
        return policy.min_residency_ms
    measured = _mean(snap.swap_times)
    if measured is None:
        return MIN_RESIDENCY_FLOOR_MS
    return max(MIN_RESIDENCY_FLOOR_MS, int(MIN_RESIDENCY_SWAPS * measured * 1000))


def waited_max_wait(
    snap: PoolSnapshot, policy: PoolPolicy, member: str, *, drain_ms: int = 0
) -> bool:
    """``member``'s most urgent waiter has waited the pool's ``maxWait`` (by its virtual
    arrival: a high priority waiter reaches it sooner), or will have by the time a drain
    of ``drain_ms`` that starts now ends; never without ``maxWait``."""
    if policy.max_wait_ms is None:
        return False
    waited = snap.now_ms - snap.urgency.get(member, snap.now_ms)
    return waited + drain_ms >= policy.max_wait_ms


def resident_long_enough(snap: PoolSnapshot, policy: PoolPolicy, since_ms: int) -> bool:
    """A member resident since ``since_ms`` has stayed its ``minResidency``: ``maxWait``
    may close it for another member."""
    return snap.now_ms - since_ms >= min_residency_ms(snap, policy)


def waiting_since_before(snap: PoolSnapshot, member: str, since_ms: int) -> bool:
    """``member``'s most urgent waiter ranks as waiting since before ``since_ms`` (the
    resident's commit): it arrived during the swap that made the resident resident, or
    earlier, or its priority moves its virtual arrival before it. ``minResidency`` keeps a
    new resident from the demand that comes after it; a waiter already in line when it
    came in is bounded by ``maxWait`` alone (its deadline wins over the dwell)."""
    return snap.urgency.get(member, snap.now_ms) <= since_ms


def expected_drain_ms(snap: PoolSnapshot, members: Iterable[str]) -> int:
    """How long closing ``members`` now is expected to take to drain (ms): the longest of
    their expected drains (:func:`drain_s`); 0 for none, or none measured."""
    return round(max((drain_s(snap, m) for m in members), default=0.0) * 1000)


def close_due(snap: PoolSnapshot, policy: PoolPolicy, member: str, closing: Iterable[str]) -> bool:
    """``maxWait`` closes ``closing`` now for ``member``: its most urgent waiter's wait plus
    their expected drain (:func:`expected_drain_ms`) reaches ``maxWait``, so the drain ends
    near ``maxWait``, not ``maxWait`` plus the drain (nothing is cut: a drain longer than
    expected only ends later)."""
    return waited_max_wait(snap, policy, member, drain_ms=expected_drain_ms(snap, closing))


def may_close(
    snap: PoolSnapshot, policy: PoolPolicy, member: str, resident: str, since_ms: int
) -> bool:
    """``resident`` (resident since ``since_ms``: its commit) may be closed for
    ``member``'s most urgent waiter as far as its own demand goes: it has been resident
    ``minResidency``, unless that waiter was in line before its commit
    (:func:`waiting_since_before`: the waiter's deadline wins over the dwell); and the
    requests it came in for are not re-asking right now (the waiter grace), unless that
    waiter ranks ahead of them (:func:`ranks_ahead`: a higher priority that came during
    the load). Shared by the one-resident pool and the capacity pool's closes."""
    if not resident_long_enough(snap, policy, since_ms) and not waiting_since_before(
        snap, member, since_ms
    ):
        return False
    # The requests it was swapped in for are re-asking right now: serve them first, or a
    # pool whose waiters all waited maxWait would swap for ever, serving no one. Unless a
    # more urgent waiter is in line: then not one of them is admitted, and it goes first.
    return (
        snap.live_waiters(resident) == 0
        or snap.now_ms - since_ms >= policy.waiter_grace_ms
        or ranks_ahead(snap, member, resident)
    )


def closing_for(snap: PoolSnapshot, policy: PoolPolicy) -> str | None:
    """The member the resident must close for now (``maxWait``): the most urgent other
    member, once the close is due (:func:`close_due`: its waiter's wait plus the
    resident's expected drain reaches ``maxWait``) and the resident's own demand lets it
    (:func:`may_close`); ``None`` when nothing closes (or it is closed already)."""
    if policy.max_wait_ms is None or snap.closed or snap.phase not in SERVING:
        return None
    member = most_urgent(snap, excluding=snap.resident)
    if member is None or snap.resident is None:
        return None
    if not close_due(snap, policy, member, (snap.resident,)):
        return None
    if not may_close(snap, policy, member, snap.resident, snap.committed_ms):
        return None
    return member


def close_for(snap: PoolSnapshot, member: str, cause: str | Keep | None) -> SetState:
    """Close the resident for ``member``: the pool drains toward it, the resident takes no
    new lease, and the close's moment is kept to measure the drain when it ends."""
    return set_state(
        phase=Phase.DRAINING, target=member, closed=True, closed_ms=snap.now_ms, cause=cause
    )


def drained(snap: PoolSnapshot) -> RecordDrainTime | None:
    """A swap starts from a closed resident that drained: how long its drain took (from
    its close to now); ``None`` when it was not closed, or its drain was recorded."""
    if not snap.closed or not snap.closed_ms or snap.resident is None:
        return None
    return RecordDrainTime(snap.resident, max(0, snap.now_ms - snap.closed_ms) / 1000)


def is_swap_back(snap: PoolSnapshot, policy: PoolPolicy, target: str | None) -> bool:
    """A swap to the member resident before the current one, soon after the current one
    came in: the pool is going back and forth (counted and audited as ``swap_back``)."""
    return (
        target is not None
        and snap.resident is not None
        and target == snap.previous
        and snap.now_ms - snap.committed_ms < policy.thrash_window_ms
    )


def eta_s(snap: PoolSnapshot, member: str, urgency_ms: int) -> tuple[float, int]:
    """The earliest a request for ``member`` (virtual arrival ``urgency_ms``) can be
    served, and its place in line (1: the next swap is its member's): a lower bound from
    measured swap times only (the rest of a swap in flight, one swap per member ranked
    ahead of it, its own); a drain adds nothing, for it may end at any moment."""
    own = min(snap.urgency.get(member, urgency_ms), urgency_ms)
    seconds = 0.0
    place = 1
    if snap.phase in IN_FLIGHT and snap.target != member:
        elapsed = (snap.now_ms - snap.started_ms) / 1000
        seconds += max(0.0, (swap_s(snap, snap.target) or 0.0) - elapsed)
        place += 1
    elif snap.phase in IN_FLIGHT:
        elapsed = (snap.now_ms - snap.started_ms) / 1000
        return max(0.0, (swap_s(snap, member) or 0.0) - elapsed), place
    for other in ranked(snap, excluding=member):
        if snap.phase in IN_FLIGHT and other == snap.target:
            continue  # counted above
        if other == snap.resident and not snap.closed:
            continue  # served where it is, no swap
        if snap.urgency.get(other, snap.now_ms) < own:
            seconds += swap_s(snap, other) or 0.0
            place += 1
    seconds += swap_s(snap, member) or 0.0
    return seconds, place


def idle_unload_due(snap: PoolSnapshot, policy: PoolPolicy) -> bool:
    """The resident served nothing, and nobody waited for it, for its ``idleUnloadAfter``
    (counted from its commit or its last lease's release, whichever came later)."""
    resident = snap.resident
    if resident is None or snap.unhealthy or snap.phase not in SERVING:
        return False
    after = policy.idle_unload_ms.get(resident)
    if after is None or resident == policy.default:
        return False  # the default member is what an idle pool returns to
    if snap.serving(resident) or snap.live_waiters(resident) > 0:
        return False
    idle_since = max(snap.committed_ms, snap.released_ms)
    return snap.now_ms - idle_since >= after


def retry_after_for(seconds: float) -> float:
    """A Retry-After from an estimate: whole seconds, at least one."""
    return float(max(1, math.ceil(seconds)))
