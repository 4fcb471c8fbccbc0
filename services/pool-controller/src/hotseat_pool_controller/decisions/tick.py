"""The supervisor's tick: move a pool forward without a request. Start a drained swap,
retarget or cancel a drain, close a resident another member waited ``maxWait`` for,
take over a swap whose owner went silent, warm the default member of a cold pool, unload
(or return to the default) a resident idle for its ``idleUnloadAfter``, recover a
resident marked unhealthy once its last lease ends."""

from __future__ import annotations

import math

from hotseat_common.messages import PoolOutcome, SwapReason
from hotseat_pool_controller.decisions.busy import (
    NOT_READ,
    SlotsRead,
    incumbent_busy,
    read_resident_first,
)
from hotseat_pool_controller.decisions.capacity import decide_capacity_tick
from hotseat_pool_controller.decisions.recovery import decide_resident_lost
from hotseat_pool_controller.decisions.schedule import (
    close_for,
    closing_for,
    idle_unload_due,
    most_urgent,
)
from hotseat_pool_controller.decisions.start import forget_cause, next_epoch, start_swap
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


def decide_tick(  # noqa: PLR0911 - one move per state of the pool
    snap: PoolSnapshot, policy: PoolPolicy, controller: str, *, slots_busy: SlotsRead = NOT_READ
) -> Decision:
    """Move the pool forward without a request: start, retarget, cancel, take over, warm."""
    if snap.phase == Phase.UNKNOWN:
        return NOTHING
    if snap.phase in IN_FLIGHT:
        return _maybe_take_over(snap, policy, controller)
    if policy.has_capacity:
        return decide_capacity_tick(snap, policy, controller, slots_busy)
    if snap.unhealthy and snap.resident is not None and not snap.serving(snap.resident):
        # It stopped answering while it served; now that nothing is left on it, recover.
        return decide_resident_lost(snap, snap.resident, "unhealthy, and its last lease ended")
    demand = most_urgent(snap, excluding=snap.resident)
    if snap.phase == Phase.DRAINING and (
        snap.target is None or snap.live_waiters(snap.target) == 0 or demand != snap.target
    ):
        # The drain's target has no waiters left, or another member's are more urgent now.
        return _retarget(snap, demand)
    if demand is None:
        return _without_demand(snap, policy, controller, slots_busy)
    return _toward(snap, policy, controller, demand, slots_busy)


def quiet_for_ms(snap: PoolSnapshot, policy: PoolPolicy, controller: str) -> float | None:
    """How long the pool has nothing to do that a tick would find by itself.

    ``None`` when it has work of its own (and for a pool with ``capacity``, whose
    residents are not looked at here): a lease or a waiter (leases are reaped, waiters
    served, a busy incumbent closed at ``maxWait``), a swap or a drain (its owner may go
    silent), an unknown or unhealthy state, or anything this tick would decide now; its
    supervisor then ticks at its usual interval. Otherwise the milliseconds until the
    first moment a tick could decide something without a request (an idle unload falling
    due, a member's failure backoff ending, a relearning window closing), ``math.inf``
    when there is none: the supervisor may sleep that long (requests, releases and other
    replicas' state changes wake it earlier)."""
    if policy.has_capacity:
        return None  # several residents: supervised on every tick, as before
    if snap.phase != Phase.IDLE or snap.unhealthy or snap.closed:
        return None
    if any(n > 0 for n in snap.leases.values()) or any(n > 0 for n in snap.waiters.values()):
        return None
    if decide_tick(snap, policy, controller) is not NOTHING:
        return None
    moments = [float(ttl) for ttl in snap.failures.values() if ttl > 0]
    if snap.relearn_ms > snap.now_ms:
        moments.append(float(snap.relearn_ms - snap.now_ms))
    resident = snap.resident
    after = policy.idle_unload_ms.get(resident) if resident is not None else None
    if after is not None and resident != policy.default:
        idle_since = max(snap.committed_ms, snap.released_ms)
        moments.append(float(max(0, idle_since + after - snap.now_ms)))
    return min(moments, default=math.inf)


def _without_demand(
    snap: PoolSnapshot, policy: PoolPolicy, controller: str, slots_busy: SlotsRead
) -> Decision:
    """Nobody waits for another member: unload a resident idle too long, warm a cold pool."""
    if idle_unload_due(snap, policy):
        return _idle_unload(snap, policy, controller, slots_busy)
    return _warm_default(snap, policy, controller)


def _toward(
    snap: PoolSnapshot, policy: PoolPolicy, controller: str, demand: str, slots_busy: SlotsRead
) -> Decision:
    """Waiters for ``demand``: drain a busy incumbent (it keeps serving, and takes new
    requests until ``maxWait`` closes it), else swap now."""
    if incumbent_busy(snap, policy, slots_busy):
        closing = closing_for(snap, policy)
        if closing is not None:
            return Decision(
                ops=(close_for(snap, closing, forget_cause(snap)),),
                pre=Preconditions(version=snap.version),
            )
        if snap.phase == Phase.IDLE:
            return Decision(
                ops=(set_state(phase=Phase.DRAINING, target=demand, cause=forget_cause(snap)),),
                pre=Preconditions(version=snap.version),
            )
        return NOTHING
    if (check := read_resident_first(snap, policy, slots_busy)) is not None:
        return check
    return start_swap(snap, policy, controller, demand, reason=SwapReason.DEMAND).decision()


def _idle_unload(
    snap: PoolSnapshot, policy: PoolPolicy, controller: str, slots_busy: SlotsRead
) -> Decision:
    """The resident served nothing for its ``idleUnloadAfter``: the default member comes
    back in its place, or (no other default) the pool goes cold. Never while it serves."""
    if incumbent_busy(snap, policy, slots_busy):
        return NOTHING
    if (check := read_resident_first(snap, policy, slots_busy)) is not None:
        return check
    default = policy.default
    if default is not None and default != snap.resident and snap.failures.get(default, 0) <= 0:
        return start_swap(
            snap, policy, controller, default, reason=SwapReason.RETURN_TO_DEFAULT, forced=True
        ).decision()
    return start_swap(snap, policy, controller, None, reason=SwapReason.IDLE_UNLOAD).decision()


def _retarget(snap: PoolSnapshot, demand: str | None) -> Decision:
    """Drain toward the most urgent member's waiters now, or, with none left, stop."""
    if demand is not None:
        return Decision(
            ops=(set_state(target=demand, cause=forget_cause(snap)),),
            pre=Preconditions(version=snap.version),
        )
    return Decision(
        ops=(set_state(phase=Phase.IDLE, target=None, closed=False, cause=forget_cause(snap)),),
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
            snap, policy, controller, policy.default, reason=SwapReason.WARM_DEFAULT, forced=True
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
            swap_id=snap.swap_id or "",
            evicts=snap.evicts if policy.has_capacity else None,
        ),
    )
