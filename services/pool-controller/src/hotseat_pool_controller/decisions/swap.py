"""The steps of a swap, taken by its owner: keep the claim, begin the load (or cancel a
swap whose demand left before it), commit the target, or fail. Each step answers
``None`` once the swap is no longer the asking controller's (another one took it over)."""

from __future__ import annotations

from dataclasses import replace

from hotseat_common.messages import PoolOutcome, RetargetReason, SwapEndReason, derived_event_id
from hotseat_pool_controller.decisions.capacity import (
    closing_at_commit,
    commit_ops,
    evicts_left,
    pending_targets,
    plan_failed_state,
    target_loaded_ops,
    unloaded_targets,
)
from hotseat_pool_controller.decisions.schedule import closing_for, retarget_for
from hotseat_pool_controller.model import (
    IN_FLIGHT,
    NOTHING,
    AuditIntent,
    ClearWaiters,
    Decision,
    Op,
    Phase,
    PoolPolicy,
    PoolSnapshot,
    Preconditions,
    RecordSwapTime,
    SetFailure,
    SetState,
    SwapOrder,
)
from hotseat_pool_controller.store.codec import KEEP, owned_by, set_state


def _owns(snap: PoolSnapshot, epoch: int, controller: str) -> bool:
    return snap.phase in IN_FLIGHT and snap.epoch == epoch and snap.owner == controller


def _still_owned(epoch: int, controller: str) -> Preconditions:
    return Preconditions(state_equals=owned_by(epoch, controller))


def _still_owned_at(snap: PoolSnapshot, epoch: int, controller: str) -> Preconditions:
    """Still the owner's, and the state unmoved since ``snap``: a step that rewrites the
    set from what it read (several targets commit concurrently, a loss may come between)."""
    return Preconditions(state_equals=owned_by(epoch, controller), version=snap.version)


def decide_heartbeat(
    snap: PoolSnapshot, policy: PoolPolicy, epoch: int, controller: str
) -> Decision | None:
    """Extend the owner's claim; ``None`` when the swap is no longer ours."""
    if not _owns(snap, epoch, controller):
        return None
    return Decision(
        ops=(set_state(heartbeat_ms=snap.now_ms + policy.heartbeat_ttl_ms, bump=False),),
        pre=_still_owned(epoch, controller),
    )


def decide_begin_load(
    snap: PoolSnapshot,
    epoch: int,
    controller: str,
    policy: PoolPolicy | None = None,
    unloaded: tuple[str, ...] = (),
    *,
    retarget: bool = False,
) -> Decision | None:
    """After the unloads: load the target, or cancel if its demand is gone. In a capacity
    pool (``policy`` says) the evicts confirmed gone (``unloaded``) stop being counted.
    With ``retarget``, a swap whose target a more urgent member now outranks
    (``retarget_for``) takes that member as its target instead and stays ``unloading``
    (``swap_retargeted``): its owner unloads the old target too, then asks again; the
    old target's waiters stay held for a later swap."""
    if not _owns(snap, epoch, controller):
        return None
    if snap.phase == Phase.LOADING:
        return NOTHING  # taken over mid-load: the load that started runs to completion
    if retarget and policy is not None and (moved := retarget_for(snap, policy)) is not None:
        return _retargeted(snap, epoch, controller, moved)
    capacity = policy is not None and policy.has_capacity
    if snap.target is not None and not snap.forced and snap.live_waiters(snap.target) == 0:
        left = set_state(evicts=evicts_left(snap, unloaded), also=())
        ended = (_cold_state(), left) if capacity else ()
        return Decision(
            ops=ended or (_cold_state(),),
            pre=Preconditions(
                state_equals=owned_by(epoch, controller), zero_waiters=(snap.target,)
            ),
            audit=_cancelled(snap, epoch, "demand_gone_before_load"),
        )
    # An unload-only swap (admin) has nothing to load: it goes straight on to its commit.
    if capacity:
        return Decision(
            ops=(
                set_state(
                    phase=Phase.LOADING,
                    loading_ms=snap.now_ms,
                    evicts=evicts_left(snap, unloaded),
                ),
            ),
            pre=_still_owned(epoch, controller),
        )
    return Decision(
        ops=(set_state(phase=Phase.LOADING, loading_ms=snap.now_ms),),
        pre=_still_owned(epoch, controller),
    )


def _retargeted(snap: PoolSnapshot, epoch: int, controller: str, member: str) -> Decision:
    """The swap loads ``member`` instead of its target (same epoch, id and owner): fenced
    on the claim, the phase and the target it read."""
    return Decision(
        ops=(set_state(target=member),),
        pre=Preconditions(
            state_equals={
                **owned_by(epoch, controller),
                "phase": Phase.UNLOADING.value,
                "target": snap.target or "",
            }
        ),
        audit=(
            AuditIntent(
                PoolOutcome.SWAP_RETARGETED,
                member=member,
                from_member=snap.target,
                to_member=member,
                epoch=epoch,
                reason=RetargetReason.MORE_URGENT,
                swap_id=snap.swap_id,
            ),
        ),
    )


def retargeted_to(decision: Decision) -> str | None:
    """The member a ``decide_begin_load`` decision retargeted its swap to, if it did."""
    for intent in decision.audit:
        if intent.outcome == PoolOutcome.SWAP_RETARGETED:
            return intent.to_member
    return None


def decide_unloads_refused(  # noqa: PLR0917 - the step's own arguments
    snap: PoolSnapshot,
    policy: PoolPolicy,
    epoch: int,
    controller: str,
    busy: tuple[str, ...],
    unloaded: tuple[str, ...] = (),
) -> Decision | None:
    """The owner's own ``/slots`` reads found ``busy`` at work right before it unloads
    them (``busySignal: leasesAndSlots``; traffic that bypasses the router shows only
    there): the swap ends without unloading them. The pool drains toward the target
    while it has waiters (Wait holds; the tick tries again, reading once more), else goes
    back to idle; a one-resident pool keeps its resident. In a capacity pool every member
    still to unload stays counted and is never granted (the busy target too), until a
    later plan finds it idle and confirms it gone."""
    if not _owns(snap, epoch, controller):
        return None
    waited = snap.target is not None and snap.live_waiters(snap.target) > 0
    owed = list(evicts_left(snap, unloaded))
    owed += [m for m in busy if m not in owed and m not in snap.residents]
    return Decision(
        ops=(
            set_state(
                phase=Phase.DRAINING if waited else Phase.IDLE,
                target=snap.target if waited else None,
                from_member=None,
                owner=None,
                forced=False,
                parked=False,
                evicts=tuple(owed) if policy.has_capacity else KEEP,
                also=() if policy.has_capacity else KEEP,
            ),
        ),
        pre=_still_owned(epoch, controller),
        audit=_cancelled(snap, epoch, "busy_slots"),
    )


def _cancelled(snap: PoolSnapshot, epoch: int, reason: str) -> tuple[AuditIntent, ...]:
    return (
        AuditIntent.of_swap(
            PoolOutcome.SWAP_CANCELLED, snap.target, snap.from_member, epoch, reason, snap=snap
        ),
    )


def _cold_state() -> SetState:
    return set_state(
        phase=Phase.IDLE,
        resident=None,
        target=None,
        from_member=None,
        owner=None,
        forced=False,
        closed=False,
    )


def decide_commit(
    snap: PoolSnapshot, epoch: int, controller: str, policy: PoolPolicy | None = None
) -> Decision | None:
    """The target is ready (or, unload-only, everything is gone): it becomes the resident,
    or, in a capacity pool (``policy`` says), joins the residency set."""
    if not _owns(snap, epoch, controller):
        return None
    seconds = max(0.0, (snap.now_ms - snap.started_ms) / 1000)
    if policy is not None and policy.has_capacity:
        # A target that joined the set already (its own commit, beside other loads) had
        # its time recorded then.
        timed = snap.target is not None and snap.target in pending_targets(snap)
        ended = set_state(
            phase=Phase.IDLE,
            target=None,
            from_member=None,
            owner=None,
            forced=False,
            committed_ms=snap.now_ms,
        )
        if (drain := closing_at_commit(snap, policy)) is not None:
            ended = ended.merged(drain)
        return Decision(
            ops=(
                ended,
                *commit_ops(snap),
                *((RecordSwapTime(seconds, member=snap.target),) if timed else ()),
            ),
            pre=_still_owned(epoch, controller),
            audit=(
                AuditIntent.of_swap(
                    PoolOutcome.SWAP_COMPLETED, snap.target, snap.from_member, epoch, snap=snap
                ),
            ),
        )
    closing = _closes_at_commit(snap, policy)
    return Decision(
        ops=(
            set_state(
                phase=Phase.DRAINING if closing else Phase.IDLE,
                resident=snap.target,
                target=closing,
                from_member=None,
                owner=None,
                forced=False,
                unhealthy=False,
                committed_ms=snap.now_ms,
                closed=closing is not None,
                closed_ms=snap.now_ms if closing else KEEP,
                cause=None if closing else KEEP,
                previous=snap.from_member,
            ),
            RecordSwapTime(seconds, member=snap.target),
        ),
        pre=_still_owned(epoch, controller),
        audit=(
            AuditIntent.of_swap(
                PoolOutcome.SWAP_COMPLETED, snap.target, snap.from_member, epoch, snap=snap
            ),
        ),
    )


def _closes_at_commit(snap: PoolSnapshot, policy: PoolPolicy | None) -> str | None:
    """The member a one-resident pool's new resident is closed for as it commits: one
    whose waiter came during the load and ranks ahead of the requests it was loaded for
    (docs/adr/0006). Closed in the commit itself, so not one of those requests is granted
    first (they wake at the commit and would take the one-round-trip grant); ``None``:
    it opens as usual."""
    if policy is None or snap.target is None:
        return None
    after = replace(
        snap,
        phase=Phase.IDLE,
        resident=snap.target,
        target=None,
        committed_ms=snap.now_ms,
        closed=False,
        previous=snap.from_member,
    )
    return closing_for(after, policy)


def decide_target_loaded(
    snap: PoolSnapshot, epoch: int, controller: str, member: str
) -> Decision | None:
    """One of a capacity pool's plan's several targets is loaded (docs/adr/0008): it
    joins the set now, its waiters granted while the others still load; its load time
    is recorded. The plan's own commit comes once every target ended."""
    if not _owns(snap, epoch, controller):
        return None
    if member in snap.residents or member not in pending_targets(snap):
        return NOTHING
    seconds = max(0.0, (snap.now_ms - snap.started_ms) / 1000)
    return Decision(
        ops=(*target_loaded_ops(snap, member), RecordSwapTime(seconds, member=member)),
        pre=_still_owned_at(snap, epoch, controller),
    )


def decide_target_failed(  # noqa: PLR0917 - the step's own arguments
    snap: PoolSnapshot, policy: PoolPolicy, epoch: int, controller: str, member: str, reason: str
) -> Decision | None:
    """One of the other members a capacity pool's plan loads beside its target failed
    to load: it stays counted (listed to unload: its load may have taken memory) until
    a later plan confirms it gone, its waiters are told, and it sits out its failure
    backoff; the plan goes on with its other targets."""
    if not _owns(snap, epoch, controller):
        return None
    if member not in pending_targets(snap):
        return NOTHING
    return Decision(
        ops=(
            set_state(evicts=(*snap.evicts, member)),
            ClearWaiters(member),
            SetFailure(member, reason, policy.failure_backoff_ms),
        ),
        pre=_still_owned_at(snap, epoch, controller),
        audit=(
            AuditIntent(
                PoolOutcome.SWAP_FAILED,
                member=member,
                to_member=member,
                epoch=epoch,
                reason=reason,
                swap_id=snap.swap_id,
            ),
        ),
    )


def decide_fail(
    snap: PoolSnapshot, policy: PoolPolicy, epoch: int, controller: str, reason: str
) -> Decision | None:
    """The swap failed or timed out (the target is already unloaded): pool cold, waiters told."""
    if not _owns(snap, epoch, controller):
        return None
    if policy.has_capacity:
        return _capacity_fail(snap, policy, epoch, controller, reason)
    if snap.target is None:  # an unload-only swap failed: nothing is known to be resident
        return Decision(
            ops=(_cold_state(),),
            pre=_still_owned(epoch, controller),
            audit=(
                AuditIntent.of_swap(
                    PoolOutcome.SWAP_FAILED, None, snap.from_member, epoch, reason, snap=snap
                ),
            ),
        )
    return Decision(
        ops=(
            _cold_state(),
            ClearWaiters(snap.target),
            SetFailure(snap.target, reason, policy.failure_backoff_ms),
        ),
        pre=_still_owned(epoch, controller),
        audit=(
            AuditIntent.of_swap(
                PoolOutcome.SWAP_FAILED, snap.target, snap.from_member, epoch, reason, snap=snap
            ),
        ),
    )


def _capacity_fail(
    snap: PoolSnapshot, policy: PoolPolicy, epoch: int, controller: str, reason: str
) -> Decision:
    """A capacity pool's plan failed: the set keeps its members; what the plan could not
    confirm gone stays counted (``plan_end_state``), its target's waiters are told."""
    ops: list[Op] = [_cold_state(), *plan_failed_state(snap)]
    failed = unloaded_targets(snap)
    if snap.also:  # the other targets that failed already were told then
        failed = tuple(m for m in failed if m == snap.target or m not in snap.evicts)
    for member in failed:
        ops += [ClearWaiters(member), SetFailure(member, reason, policy.failure_backoff_ms)]
    return Decision(
        ops=tuple(ops),
        pre=_still_owned(epoch, controller),
        audit=(
            AuditIntent.of_swap(
                PoolOutcome.SWAP_FAILED, snap.target, snap.from_member, epoch, reason, snap=snap
            ),
        ),
    )


def decide_lost_swap_end(snap: PoolSnapshot, order: SwapOrder, target: str) -> Decision:
    """The end of a swap whose owner lost its claim while the claim still held (no other
    replica could have taken it over): when the state was rebuilt after the swap's epoch,
    the store lost the swap with it and nobody else will end it, so its owner does
    (``swap_cancelled``, ``pool_state_lost``; docs/adr/0005, point 9). Any other state
    took the swap over (its new owner ends it), or is not known yet: ``NOTHING``. The
    event's id comes from the swap's, so every owner that sends it sends one event."""
    if snap.phase == Phase.UNKNOWN or snap.rebuilt_epoch <= order.epoch:
        return NOTHING
    intent = AuditIntent.of_swap(
        PoolOutcome.SWAP_CANCELLED,
        target or None,
        order.from_member,
        order.epoch,
        SwapEndReason.POOL_STATE_LOST.value,
    )
    if not order.swap_id:  # nothing to derive its id from: a new one
        return Decision(audit=(intent,))
    event_id = derived_event_id(PoolOutcome.SWAP_CANCELLED.value, order.swap_id)
    return Decision(audit=(replace(intent, swap_id=order.swap_id, event_id=event_id),))
