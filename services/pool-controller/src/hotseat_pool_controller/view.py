"""What the admin API and ``hotseat status`` show of a pool: what is true right now.

While a swap unloads or loads, nothing serves: the view names no resident, but the member
being unloaded or loaded, how long the swap has run and how long it is expected to take
(the target's own measured swap time; none before a swap to it was measured)."""

from __future__ import annotations

from hotseat_common.messages import PoolView
from hotseat_pool_controller.decisions.capacity import free_gib, pending_targets
from hotseat_pool_controller.decisions.hold import measured_swap_s
from hotseat_pool_controller.decisions.preload import Preloads
from hotseat_pool_controller.decisions.schedule import ranked, swap_s
from hotseat_pool_controller.model import IN_FLIGHT, Phase, PoolPolicy, PoolSnapshot


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def pool_view(policy: PoolPolicy, snap: PoolSnapshot, preloads: Preloads | None = None) -> PoolView:
    in_flight = snap.phase in IN_FLIGHT
    elapsed = max(0.0, (snap.now_ms - snap.started_ms) / 1000) if in_flight else None
    # In flight, the target's own measured swaps (as the scheduler's estimate): another
    # member's load says nothing about this one's, and a 0.4 s warm-up would make a 3 s
    # load look stuck. At rest, the pool's mean.
    expected = swap_s(snap, snap.target) if in_flight else measured_swap_s(snap)
    remaining = None if elapsed is None or expected is None else max(0.0, expected - elapsed)
    queue = ranked(snap, excluding=None if snap.closed else snap.resident)
    if policy.has_capacity:
        return _capacity_view(policy, snap, elapsed, expected, remaining, preloads=preloads)
    return PoolView(
        name=policy.name,
        resident=None if in_flight else snap.resident,
        swapping=snap.target,
        phase=snap.phase.value,
        unloading=snap.from_member if snap.phase == Phase.UNLOADING else None,
        loading=snap.target if snap.phase == Phase.LOADING else None,
        swap_id=snap.swap_id if in_flight else None,
        swap_elapsed_s=_seconds(elapsed),
        swap_expected_s=_seconds(expected),
        swap_remaining_s=_seconds(remaining),
        epoch=snap.epoch,
        leases={m: snap.live_leases(m) for m in policy.members},
        waiters={m: snap.live_waiters(m) for m in policy.members},
        unhealthy=snap.unhealthy,
        relearning=snap.relearning,
        closed=snap.closed,
        queue=queue,
        queue_waited_s={
            m: round(max(0.0, (snap.now_ms - snap.urgency.get(m, snap.now_ms)) / 1000), 3)
            for m in queue
        },
        residents=[snap.resident] if snap.resident and not in_flight else [],
    )


def _capacity_view(
    policy: PoolPolicy,
    snap: PoolSnapshot,
    elapsed: float | None,
    expected: float | None,
    remaining: float | None,
    *,
    preloads: Preloads | None,
) -> PoolView:
    """A capacity pool: its residents serve throughout a plan (docs/adr/0008); which of
    them this controller preloaded, and what it has still to preload."""
    in_flight = snap.phase in IN_FLIGHT
    queue = ranked(snap, among=frozenset(policy.members) - snap.residents)
    return PoolView(
        name=policy.name,
        resident=None,
        swapping=snap.target,
        phase=snap.phase.value,
        unloading=snap.evicts[0] if snap.phase == Phase.UNLOADING and snap.evicts else None,
        loading=snap.target if in_flight else None,
        swap_id=snap.swap_id if in_flight else None,
        swap_elapsed_s=_seconds(elapsed),
        swap_expected_s=_seconds(expected),
        swap_remaining_s=_seconds(remaining),
        epoch=snap.epoch,
        leases={m: snap.live_leases(m) for m in policy.members},
        waiters={m: snap.live_waiters(m) for m in policy.members},
        relearning=snap.relearning,
        closed=bool(snap.closing),
        closing=sorted(snap.closing),
        queue=queue,
        queue_waited_s={
            m: round(max(0.0, (snap.now_ms - snap.urgency.get(m, snap.now_ms)) / 1000), 3)
            for m in queue
        },
        residents=sorted(snap.residents),
        loading_also=[m for m in pending_targets(snap) if m != snap.target] if in_flight else [],
        evicting=list(snap.evicts),
        capacity_gib=policy.capacity_gib,
        free_gib=round(free_gib(snap, policy), 3),
        preloaded=sorted(preloads.loaded & snap.residents) if preloads else [],
        preload_pending=list(preloads.pending) if preloads else [],
    )
