"""Starting a swap: the pool moves to ``unloading`` under a new epoch, claimed by the
controller that decided it, on the condition that the incumbent still serves nothing."""

from __future__ import annotations

from dataclasses import dataclass

from hotseat_common.messages import PoolOutcome, SwapReason, WaitReason, WaitReply
from hotseat_pool_controller.decisions.busy import just_committed
from hotseat_pool_controller.decisions.hold import retry_after_s
from hotseat_pool_controller.decisions.schedule import drained, is_swap_back
from hotseat_pool_controller.model import (
    AuditIntent,
    Decision,
    Op,
    Phase,
    PoolPolicy,
    PoolSnapshot,
    Preconditions,
    Reply,
    SetState,
    SwapOrder,
)
from hotseat_pool_controller.store.codec import KEEP, Keep, set_state


def next_epoch(snap: PoolSnapshot) -> int:
    """Strictly above the last epoch, and above any epoch issued before Redis lost data."""
    return max(snap.epoch + 1, snap.now_ms)


def forget_cause(snap: PoolSnapshot) -> Keep | None:
    """Clears the drain's cause (written only when there is one): the drain changed
    target, stopped, or became a swap."""
    return None if snap.cause else KEEP


def swap_id_of(pool: str, epoch: int) -> str:
    """A swap's id: its pool and the epoch it started under, unique per pool (epochs only
    grow, even past a store that lost its data) and kept when another replica takes the
    swap over under a newer epoch."""
    return f"{pool}-{epoch}"


@dataclass(frozen=True, slots=True)
class Claim:
    """What every swap (a capacity pool's plan too) writes when it starts: ``unloading``
    under a new epoch, owned by the controller that decided it, with its heartbeat,
    deadline and id; and the request that caused it."""

    state: SetState
    epoch: int
    swap_id: str
    cause: str | None


def claim(
    snap: PoolSnapshot,
    policy: PoolPolicy,
    controller: str,
    target: str | None,
    from_member: str | None,
    *,
    forced: bool,
    cause: str | None,
) -> Claim:
    """``cause``: the request that starts the swap; by default, for a drain's target, the
    request that began the drain."""
    epoch = next_epoch(snap)
    swap_id = swap_id_of(policy.name, epoch)
    if cause is None and target is not None and target == snap.target:
        cause = snap.cause
    state = set_state(
        phase=Phase.UNLOADING,
        target=target,
        from_member=from_member,
        epoch=epoch,
        owner=controller,
        heartbeat_ms=snap.now_ms + policy.heartbeat_ttl_ms,
        started_ms=snap.now_ms,
        deadline_ms=snap.now_ms + policy.swap_timeout_ms,
        forced=forced or target is None,
        swap_id=swap_id,
        cause=forget_cause(snap),
        loading_ms=None if snap.loading_ms else KEEP,
    )
    return Claim(state, epoch, swap_id, cause)


@dataclass(frozen=True, slots=True)
class SwapStart:
    state: SetState
    guard: Preconditions
    """The state read, and an incumbent that still has no live lease (and, right after
    its commit, no waiter)."""
    order: SwapOrder
    audit: AuditIntent
    records: tuple[Op, ...] = ()
    """Measurements that come with the start (a closed resident's drain)."""

    def decision(
        self,
        reply: Reply | None = None,
        *,
        also: tuple[Op, ...] = (),
        pre: Preconditions | None = None,
    ) -> Decision:
        """The decision that starts this swap (``also``: writes that come with it)."""
        return Decision(
            reply=reply,
            ops=(self.state, *self.records, *also),
            pre=pre or self.guard,
            swap=self.order,
            audit=(self.audit,),
        )

    def wait_reply(self, snap: PoolSnapshot) -> WaitReply:
        """What a request held for this swap is told."""
        return WaitReply(
            reason=WaitReason.SWAP_IN_FLIGHT,
            target=self.order.target or None,
            epoch=self.order.epoch,
            retry_after_s=retry_after_s(snap),
            swap_id=self.order.swap_id,
        )


def start_swap(
    snap: PoolSnapshot,
    policy: PoolPolicy,
    controller: str,
    target: str | None,
    *,
    reason: SwapReason,
    forced: bool = False,
    guard_waiters: bool = True,
    cause: str | None = None,
) -> SwapStart:
    """Unload the incumbent, then load ``target`` (``None``: an admin unload, after which
    the pool stays cold). ``forced``: load even without waiters (a warm-up, an admin
    swap). ``guard_waiters``: the resident's waiters just after its commit count as
    busy (an admin action, which ignores waiters, passes False). ``cause``: the request
    that starts it; by default, for a drain's target, the request that began the drain."""
    unload_only = target is None
    started = claim(snap, policy, controller, target, snap.resident, forced=forced, cause=cause)
    epoch, swap_id = started.epoch, started.swap_id
    drain = drained(snap)
    state = started.state.merged(
        set_state(
            resident=snap.resident,
            parked=unload_only,
            unhealthy=False,
            relearn_ms=None,
            # Recorded once: a swap refused and started again does not count it twice.
            closed_ms=None if drain is not None else KEEP,
        )
    )
    busy_guard = (snap.resident,) if snap.resident else ()
    # The resident's waiters count as busy only just after its commit (incumbent_busy);
    # later they are strays (a router that died while held) and the decision ignores
    # them, so the precondition must too: requiring zero would fail every attempt until
    # the stray's deadline, and every decision for the pool would lose all its races.
    waiter_guard = (
        busy_guard if guard_waiters and just_committed(snap, policy) and not snap.closed else ()
    )
    if reason == SwapReason.DEMAND and is_swap_back(snap, policy, target):
        reason = SwapReason.SWAP_BACK
    guard = Preconditions(version=snap.version, zero_leases=busy_guard, zero_waiters=waiter_guard)
    audit = AuditIntent(
        PoolOutcome.SWAP_STARTED,
        member=target or snap.resident,
        from_member=snap.resident,
        to_member=target,
        epoch=epoch,
        reason=reason,
        request_id=started.cause,
        swap_id=swap_id,
    )
    order = SwapOrder(target=target or "", epoch=epoch, from_member=snap.resident, swap_id=swap_id)
    return SwapStart(state, guard, order, audit, (drain,) if drain is not None else ())
