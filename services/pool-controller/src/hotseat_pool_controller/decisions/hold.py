"""Holding a request: it becomes one of the pool's waiters (bounded by ``maxWaiters``) and
is told when to expect the pool warm; a request that stops waiting leaves at once."""

from __future__ import annotations

from dataclasses import replace

from hotseat_common.errors import ErrorCode
from hotseat_common.messages import ErrorReply, WaitReason, WaitReply
from hotseat_pool_controller.decisions.schedule import eta_s, retry_after_for
from hotseat_pool_controller.model import (
    IN_FLIGHT,
    AcquireAsk,
    AddWaiter,
    Decision,
    Op,
    PoolPolicy,
    PoolSnapshot,
    Preconditions,
    RemoveWaiter,
)

DEFAULT_SWAP_ESTIMATE_S = 5.0
MIN_RETRY_AFTER_S = 1.0


def measured_swap_s(snap: PoolSnapshot) -> float | None:
    """The pool's mean measured swap time; ``None`` before any swap was measured."""
    if not snap.swap_times:
        return None
    return sum(snap.swap_times) / len(snap.swap_times)


def swap_estimate_s(snap: PoolSnapshot) -> float:
    measured = measured_swap_s(snap)
    return DEFAULT_SWAP_ESTIMATE_S if measured is None else measured


def retry_after_s(snap: PoolSnapshot) -> float:
    """When the pool is likely to be warm for a new target: from measured swap times."""
    estimate = swap_estimate_s(snap)
    if snap.phase in IN_FLIGHT and snap.started_ms:
        estimate -= (snap.now_ms - snap.started_ms) / 1000
    return max(MIN_RETRY_AFTER_S, round(estimate, 3))


def queue_full(snap: PoolSnapshot, policy: PoolPolicy) -> ErrorReply | None:
    """The refusal of a new waiter when the pool holds ``maxWaiters`` already."""
    if snap.attempt_waiting or snap.total_waiters < policy.max_waiters:
        return None
    return ErrorReply(
        code=ErrorCode.POOL_QUEUE_FULL,
        message=f"pool {policy.name} holds {snap.total_waiters} requests (maxWaiters)",
        retry_after_s=retry_after_s(snap),
    )


def waiter_cap(snap: PoolSnapshot, policy: PoolPolicy, pre: Preconditions) -> Preconditions:
    """``pre``, and the pool's waiters still below ``maxWaiters`` when the writes land
    (unless this request already counts as a waiter)."""
    if snap.attempt_waiting:
        return pre
    refusal = ErrorReply(
        code=ErrorCode.POOL_QUEUE_FULL,
        message=f"pool {policy.name} holds maxWaiters requests",
        retry_after_s=retry_after_s(snap),
    )
    return replace(pre, waiter_cap=policy.max_waiters, over_cap=refusal)


def over_budget(snap: PoolSnapshot, ask: AcquireAsk, policy: PoolPolicy) -> Decision | None:
    """The refusal of a request the pool cannot serve within what is left of its hold (the
    earliest it could be served, from measured swap times, is later): answered at once,
    not held to its end (docs/adr/0006); ``None`` when it may wait."""
    eta, _ = eta_s(snap, ask.member, ask.urgency_ms(policy))
    left = (ask.deadline_ms - snap.now_ms) / 1000
    if eta <= left:
        return None
    return Decision(
        reply=ErrorReply(
            code=ErrorCode.ETA_OVER_BUDGET,
            message=f"{ask.member} can be served in {eta:.1f}s at the earliest; the request"
            f" is held for {max(0.0, left):.1f}s more",
            retry_after_s=retry_after_for(eta),
        ),
        ops=withdraw(snap, ask),
    )


def hold(
    snap: PoolSnapshot,
    ask: AcquireAsk,
    policy: PoolPolicy,
    reason: WaitReason,
    *,
    target: str | None,
    also: tuple[Op, ...] = (),
) -> Decision:
    """Make the request a waiter for its member (unless the queue is full, or the pool
    cannot serve it before its hold ends): ``reason`` says why, ``also`` are the writes
    that come with it."""
    if (full := queue_full(snap, policy)) is not None:
        return Decision(reply=full)
    if (late := over_budget(snap, ask, policy)) is not None:
        return late
    urgency = ask.urgency_ms(policy)
    eta, place = eta_s(snap, ask.member, urgency)
    return Decision(
        reply=WaitReply(
            reason=reason,
            target=target,
            epoch=snap.epoch,
            retry_after_s=retry_after_s(snap),
            position=place,
            eta_s=round(eta, 3),
            swap_id=snap.swap_id if snap.phase in IN_FLIGHT else None,
        ),
        ops=(AddWaiter(ask.member, ask.attempt, ask.deadline_ms, urgency), *also),
        pre=waiter_cap(snap, policy, Preconditions(version=snap.version)),
    )


def withdraw(snap: PoolSnapshot, ask: AcquireAsk) -> tuple[Op, ...]:
    """A request that stops waiting (told busy or failed) leaves the waiters at once."""
    return (RemoveWaiter(ask.member, ask.attempt),) if snap.attempt_waiting else ()
