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
    SERVING,
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


def rest_for_ms(snap: PoolSnapshot, policy: PoolPolicy, controller: str) -> float | None:
    """How long the pool's supervisor may sleep before it reads the pool again, busy or
    not (docs/adr/0011): the milliseconds until the first moment a tick could decide
    something that no wake-up announces, ``math.inf`` when there is none.

    The moments: a resident's idle unload falling due, a member's failure backoff
    ending, a relearning window closing, and for a busy pool: its first live lease's
    expiry (reaped then, and the member may stop serving), its first live waiter's
    deadline (demand may go), a swap owner's heartbeat lapsing (taken over), the new
    resident's waiters' grace ending, and, while its resident serves or is waited for,
    ``idleUnloadAfter`` from now (the earliest its idle unload can fall due after a
    release that wakes nobody). A grant or a renewal moves no moment earlier (each lease
    expires ``leaseTtl`` after it, after every lease read before); what else can move the
    pool wakes the supervisor (an acquire that left a waiter, a release that can move it,
    a cancel, a state change, an admin action).

    ``None``: tick at the usual interval: a pool with ``capacity`` (not looked at here),
    an unknown or unhealthy state, one read without its deadlines, anything this tick
    would decide now (a member's ``/slots`` to read included), and a resident that
    ``maxWait`` may close for another member's waiters (the close falls due earlier as
    renewals and releases report longer requests, which wake nobody)."""
    if policy.has_capacity or snap.phase == Phase.UNKNOWN or snap.unhealthy:
        return None
    if any(n > 0 and m not in snap.lease_expiry for m, n in snap.leases.items()) or any(
        n > 0 and m not in snap.waiter_deadline for m, n in snap.waiters.items()
    ):
        return None
    if decide_tick(snap, policy, controller) is not NOTHING:
        return None
    if (
        policy.max_wait_ms is not None
        and snap.phase in SERVING
        and not snap.closed
        and most_urgent(snap, excluding=snap.resident) is not None
    ):
        return None
    now = snap.now_ms
    moments = [float(ttl) for ttl in snap.failures.values() if ttl > 0]
    moments += [float(at - now) for at in snap.lease_expiry.values()]
    moments += [float(at - now) for at in snap.waiter_deadline.values()]
    if snap.relearn_ms > now:
        moments.append(float(snap.relearn_ms - now))
    if snap.phase in IN_FLIGHT:
        moments.append(float(snap.heartbeat_ms + 1 - now))
    if snap.committed_ms + policy.waiter_grace_ms > now:
        moments.append(float(snap.committed_ms + policy.waiter_grace_ms - now))
    resident = snap.resident
    after = policy.idle_unload_ms.get(resident) if resident is not None else None
    if after is not None and resident != policy.default:
        if snap.serving(resident) or snap.live_waiters(resident) > 0:
            moments.append(float(after))
        else:
            idle_since = max(snap.committed_ms, snap.released_ms)
            moments.append(float(idle_since + after - now))
    return max(0.0, min(moments, default=math.inf))


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
