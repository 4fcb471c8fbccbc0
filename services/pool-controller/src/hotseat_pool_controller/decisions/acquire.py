"""One acquire (PRODUCT.md section 2): grant, hold, skip or refuse, and start the swap it
needs when the incumbent is idle."""

from __future__ import annotations

from hotseat_common.config.model import PoolActivation
from hotseat_common.errors import ErrorCode
from hotseat_common.messages import (
    ErrorReply,
    Granted,
    IncumbentBusyReply,
    SwapReason,
    WaitReason,
    WaitReply,
)
from hotseat_pool_controller.decisions.busy import (
    NOT_READ,
    SlotsRead,
    incumbent_busy,
    read_resident_first,
)
from hotseat_pool_controller.decisions.capacity import decide_capacity_acquire
from hotseat_pool_controller.decisions.hold import (
    MIN_RETRY_AFTER_S,
    hold,
    over_budget,
    queue_full,
    retry_after_s,
    waiter_cap,
    withdraw,
)
from hotseat_pool_controller.decisions.schedule import close_for, closing_for
from hotseat_pool_controller.decisions.start import forget_cause, start_swap
from hotseat_pool_controller.model import (
    IN_FLIGHT,
    SERVING,
    AcquireAsk,
    AddLease,
    AddWaiter,
    Decision,
    Op,
    Phase,
    PoolPolicy,
    PoolSnapshot,
    Preconditions,
    RemoveWaiter,
)
from hotseat_pool_controller.store.codec import set_state


def decide_acquire(  # noqa: PLR0911 - one answer per case of PRODUCT.md section 2
    snap: PoolSnapshot,
    ask: AcquireAsk,
    policy: PoolPolicy,
    controller: str,
    *,
    slots_busy: SlotsRead = NOT_READ,
) -> Decision:
    """PRODUCT.md section 2, one acquire at a time."""
    early = _before_residency(snap, ask, policy)
    if early is not None:
        return early
    if policy.has_capacity:
        return decide_capacity_acquire(
            snap, ask, policy, controller, _grant(snap, ask, policy), slots_busy
        )
    if snap.resident == ask.member and snap.phase in SERVING:
        return _for_resident(snap, ask, policy)
    if snap.phase in IN_FLIGHT:
        return _while_in_flight(snap, ask, policy)
    # The member is not resident, and no swap is in flight (idle or draining).
    busy = incumbent_busy(snap, policy, slots_busy)
    if not busy and (check := read_resident_first(snap, policy, slots_busy)) is not None:
        return check
    if busy:
        return _behind_busy_incumbent(snap, ask, policy)
    return _swap_now(snap, ask, policy, controller)


def _before_residency(snap: PoolSnapshot, ask: AcquireAsk, policy: PoolPolicy) -> Decision | None:
    """What is answered whatever the residency: an unknown member, a pool being rebuilt,
    an attempt that holds its lease already, a member whose last swap failed."""
    if ask.member not in policy.members:
        return Decision(
            reply=ErrorReply(
                code=ErrorCode.UNKNOWN_POOL,
                message=f"{ask.member!r} is not a member of pool {policy.name!r}",
            )
        )
    if snap.phase == Phase.UNKNOWN:
        return Decision(
            reply=WaitReply(reason=WaitReason.RECONCILING, epoch=snap.epoch, retry_after_s=1.0)
        )
    held = snap.attempt_lease
    if held is not None and held.member == ask.member:
        # A re-asked acquire (same attempt) gets the lease it already has, with the time
        # that lease has left: the router must not believe it lives longer than it does.
        left_ms = held.expiry_ms - snap.now_ms if held.expiry_ms else policy.lease_ttl_ms
        return Decision(
            reply=Granted(lease_id=held.lease_id, ttl_s=max(0, left_ms) / 1000, epoch=held.epoch)
        )
    backoff_ms = snap.failures.get(ask.member, 0)
    if backoff_ms > 0:
        return Decision(
            reply=ErrorReply(
                code=ErrorCode.SWAP_FAILED,
                message=f"the last swap to {ask.member} failed; retrying after a backoff",
                retry_after_s=max(MIN_RETRY_AFTER_S, backoff_ms / 1000),
            ),
            ops=withdraw(snap, ask),
        )
    return None


def _for_resident(snap: PoolSnapshot, ask: AcquireAsk, policy: PoolPolicy) -> Decision:
    """Granted at once (sticky residency), unless the resident stopped answering while it
    serves: IfIdle goes elsewhere at once, Wait holds until it answers again or is
    replaced (never dispatched to a member in doubt); or unless it is closed to new
    requests (another member waited ``maxWait``, docs/adr/0006): IfIdle goes elsewhere,
    Wait holds for the swap back (the request closes it when it is the first to see that
    the time has come)."""
    closing = closing_for(snap, policy)
    if snap.unhealthy or snap.closed or closing is not None:
        if ask.mode == PoolActivation.IF_IDLE:
            return _busy(snap, ask)
        if snap.unhealthy:
            return hold(snap, ask, policy, WaitReason.RECOVERING, target=ask.member)
        also: tuple[Op, ...] = ()
        if closing is not None:
            also = (close_for(snap, closing, forget_cause(snap)),)
        return hold(snap, ask, policy, WaitReason.CLOSED, target=closing or snap.target, also=also)
    return _grant(snap, ask, policy)


def _while_in_flight(snap: PoolSnapshot, ask: AcquireAsk, policy: PoolPolicy) -> Decision:
    """A swap is in flight: the request waits for it in both modes, unless (IfIdle) the
    swap loads another member for its own waiters: held through it, the request would meet
    a target busy with the requests it was loaded for, and be skipped then: tell it now."""
    if ask.mode == PoolActivation.IF_IDLE and _swap_serves_others(snap, ask.member):
        return _busy(snap, ask)
    return hold(snap, ask, policy, WaitReason.SWAP_IN_FLIGHT, target=snap.target)


def _behind_busy_incumbent(snap: PoolSnapshot, ask: AcquireAsk, policy: PoolPolicy) -> Decision:
    """IfIdle skips at once; Wait holds while the pool drains toward the member it waits
    for (or toward the target already draining)."""
    if ask.mode == PoolActivation.IF_IDLE:
        return _busy(snap, ask)
    draining = snap.phase == Phase.DRAINING
    also: tuple[Op, ...] = ()
    if snap.phase == Phase.IDLE:
        also = (set_state(phase=Phase.DRAINING, target=ask.member, cause=ask.request_id),)
    return hold(
        snap,
        ask,
        policy,
        WaitReason.DRAINING,
        target=snap.target if draining else ask.member,
        also=also,
    )


def _swap_now(snap: PoolSnapshot, ask: AcquireAsk, policy: PoolPolicy, controller: str) -> Decision:
    """Incumbent idle, or the pool is cold: start the swap now (to the pending target, if
    one is draining with demand, else to this member); this request waits for it."""
    if (full := queue_full(snap, policy)) is not None:
        return Decision(reply=full)
    target = ask.member
    if snap.phase == Phase.DRAINING and snap.target and snap.live_waiters(snap.target) > 0:
        target = snap.target
    drained_for = snap.cause if snap.target == target else None
    cause = drained_for or (ask.request_id if target == ask.member else None)
    start = start_swap(snap, policy, controller, target, reason=SwapReason.DEMAND, cause=cause)
    if target != ask.member and ask.mode == PoolActivation.IF_IDLE:
        # The drained GPU goes to the requests that waited for it; an IfIdle request for
        # another member starts that swap but is not held through it only to be skipped.
        busy = IncumbentBusyReply(resident=snap.resident, retry_after_s=retry_after_s(snap))
        return start.decision(busy, also=withdraw(snap, ask))
    if target == ask.member and (late := over_budget(snap, ask, policy)) is not None:
        return late
    return start.decision(
        start.wait_reply(snap),
        also=(AddWaiter(ask.member, ask.attempt, ask.deadline_ms, ask.urgency_ms(policy)),),
        pre=waiter_cap(snap, policy, start.guard),
    )


def _swap_serves_others(snap: PoolSnapshot, member: str) -> bool:
    """The swap in flight loads another member for requests that wait for it."""
    return snap.target is not None and snap.target != member and snap.live_waiters(snap.target) > 0


def _busy(snap: PoolSnapshot, ask: AcquireAsk) -> Decision:
    """IfIdle: the GPU is (or is about to be) busy with another member; skip at once."""
    return Decision(
        reply=IncumbentBusyReply(
            resident=snap.resident,
            retry_after_s=retry_after_s(snap),
            swap_id=snap.swap_id if snap.phase in IN_FLIGHT else None,
        ),
        ops=withdraw(snap, ask),
    )


def _grant(snap: PoolSnapshot, ask: AcquireAsk, policy: PoolPolicy) -> Decision:
    lease = AddLease(
        ask.member,
        ask.lease_id,
        snap.now_ms + policy.lease_ttl_ms,
        ask.attempt,
        request_id=ask.request_id,
        router=ask.router,
        epoch=snap.epoch,
    )
    ops: tuple[Op, ...] = (lease,)
    if snap.attempt_waiting:
        ops = (lease, RemoveWaiter(ask.member, ask.attempt))
    return Decision(
        reply=Granted(
            lease_id=ask.lease_id,
            ttl_s=policy.lease_ttl_ms / 1000,
            epoch=snap.epoch,
            # It waited, and is served now: by the swap that made its member resident.
            swap_id=snap.swap_id if snap.attempt_waiting else None,
        ),
        ops=ops,
        pre=Preconditions(version=snap.version),
    )
