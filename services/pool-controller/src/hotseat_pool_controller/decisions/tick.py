"""The supervisor's tick: move a pool forward without a request. Start a drained swap,
retarget or cancel a drain, take over a swap whose owner went silent, warm the default
member of a cold pool, recover a resident marked unhealthy once its last lease ends."""

from __future__ import annotations

from hotseat_common.messages import PoolOutcome
from hotseat_pool_controller.decisions.busy import incumbent_busy, needs_slots
from hotseat_pool_controller.decisions.recovery import decide_resident_lost
from hotseat_pool_controller.decisions.start import next_epoch, start_swap
from hotseat_pool_controller.model import (
    IN_FLIGHT,
    NOTHING,
    AuditIntent,
    Decision,
    Phase,
    PoolPolicy,
    PoolSnapshot,
    Preconditions,
    SwapOrder,
)
from hotseat_pool_controller.store.codec import set_state


def decide_tick(
    snap: PoolSnapshot, policy: PoolPolicy, controller: str, *, slots_busy: bool | None = None
) -> Decision:
    """Move the pool forward without a request: start, retarget, cancel, take over, warm."""
    if snap.phase == Phase.UNKNOWN:
        return NOTHING
    if snap.phase in IN_FLIGHT:
        return _maybe_take_over(snap, policy, controller)
    if snap.unhealthy and snap.resident is not None and not snap.serving(snap.resident):
        # It stopped answering while it served; now that nothing is left on it, recover.
        return decide_resident_lost(snap, snap.resident, "unhealthy, and its last lease ended")
    demand = _demand(snap, policy)
    if snap.phase == Phase.DRAINING:
        if snap.target is None or snap.live_waiters(snap.target) == 0:
            return _drain_without_demand(snap, demand)
        demand = snap.target
    if demand is None:
        return _warm_default(snap, policy, controller)
    return _toward(snap, policy, controller, demand, slots_busy)


def _toward(
    snap: PoolSnapshot, policy: PoolPolicy, controller: str, demand: str, slots_busy: bool | None
) -> Decision:
    """Waiters for ``demand``: drain a busy incumbent (it keeps serving), else swap now."""
    if incumbent_busy(snap, policy, slots_busy):
        if snap.phase == Phase.IDLE:
            return Decision(
                ops=(set_state(phase=Phase.DRAINING, target=demand),),
                pre=Preconditions(version=snap.version),
            )
        return NOTHING
    if needs_slots(snap, policy, slots_busy):
        return Decision(need_idle_check=snap.resident)
    return start_swap(snap, policy, controller, demand, reason="demand").decision()


def _demand(snap: PoolSnapshot, policy: PoolPolicy) -> str | None:
    """The non-resident member with the most live waiters (ties: config order)."""
    best: str | None = None
    for member in policy.members:
        if member == snap.resident or snap.live_waiters(member) == 0:
            continue
        if best is None or snap.live_waiters(member) > snap.live_waiters(best):
            best = member
    return best


def _drain_without_demand(snap: PoolSnapshot, demand: str | None) -> Decision:
    """The drain's target has no waiters left: drain toward another member's, or stop."""
    if demand is not None:
        return Decision(ops=(set_state(target=demand),), pre=Preconditions(version=snap.version))
    return Decision(
        ops=(set_state(phase=Phase.IDLE, target=None),),
        pre=Preconditions(version=snap.version, zero_waiters=(snap.target,) if snap.target else ()),
        audit=(
            AuditIntent.of_swap(
                PoolOutcome.SWAP_CANCELLED,
                snap.target,
                snap.resident,
                snap.epoch,
                "demand_gone_while_draining",
            ),
        ),
    )


def _warm_default(snap: PoolSnapshot, policy: PoolPolicy, controller: str) -> Decision:
    """A cold pool (not parked by an admin) loads its ``default`` member."""
    if (
        snap.resident is None
        and not snap.parked
        and policy.default
        and snap.failures.get(policy.default, 0) <= 0
    ):
        return start_swap(
            snap, policy, controller, policy.default, reason="warm_default", forced=True
        ).decision()
    return NOTHING


def _maybe_take_over(snap: PoolSnapshot, policy: PoolPolicy, controller: str) -> Decision:
    """A swap whose owner's heartbeat lapsed: claim it under a newer epoch (fencing the old
    owner) in the phase it was in. In ``loading`` the target's load has started, and a load
    that started runs to completion; in ``unloading`` the new owner starts over at the
    unloads (nothing is loaded before every other member is confirmed gone)."""
    if snap.heartbeat_ms >= snap.now_ms:
        return NOTHING
    epoch = next_epoch(snap)
    return Decision(
        ops=(
            set_state(
                epoch=epoch,
                owner=controller,
                heartbeat_ms=snap.now_ms + policy.heartbeat_ttl_ms,
            ),
        ),
        pre=Preconditions(version=snap.version),
        swap=SwapOrder(
            target=snap.target or "",
            epoch=epoch,
            from_member=snap.from_member,
            resume=True,
            loading=snap.phase == Phase.LOADING,
        ),
    )
