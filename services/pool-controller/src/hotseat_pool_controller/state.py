"""Pure pool decisions: a snapshot of one pool in, a decision out. No I/O here.

A :class:`Decision` is what to answer, which writes to make, and the preconditions the
decision relied on; :mod:`hotseat_pool_controller.store` applies it atomically and asks
again from a fresh snapshot when a precondition no longer holds. See docs/adr/0001.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from hotseat_common.config.model import BusySignal, Pool, PoolActivation
from hotseat_common.errors import ErrorCode
from hotseat_common.messages import (
    AcquireRequest,
    ErrorReply,
    Granted,
    IncumbentBusyReply,
    PoolOutcome,
    WaitReason,
    WaitReply,
)

DEFAULT_SWAP_ESTIMATE_S = 5.0
MIN_RETRY_AFTER_S = 1.0


class Phase(StrEnum):
    UNKNOWN = "unknown"
    IDLE = "idle"
    DRAINING = "draining"
    UNLOADING = "unloading"
    LOADING = "loading"


IN_FLIGHT = frozenset({Phase.UNLOADING, Phase.LOADING})


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    """The parts of a pool's config (and the controller's timing) that decisions use."""

    name: str
    members: tuple[str, ...]
    max_waiters: int
    lease_ttl_ms: int
    swap_timeout_ms: int
    failure_backoff_ms: int
    busy_signal: BusySignal
    default: str | None
    heartbeat_ttl_ms: int = 3000
    waiter_grace_ms: int = 5000
    """After a swap, the new resident's waiters count as busy this long (they are re-asking
    right now); later, a waiter left behind by a dead router no longer pins the resident."""

    @classmethod
    def from_config(cls, pool: Pool, *, heartbeat_ttl_s: float = 3.0) -> PoolPolicy:
        return cls(
            name=pool.name,
            members=tuple(m.name for m in pool.members),
            max_waiters=pool.max_waiters,
            lease_ttl_ms=int(pool.lease_ttl * 1000),
            swap_timeout_ms=int(pool.swap_timeout * 1000),
            failure_backoff_ms=int(pool.swap_failure_backoff * 1000),
            busy_signal=pool.busy_signal,
            default=pool.default,
            heartbeat_ttl_ms=int(heartbeat_ttl_s * 1000),
        )


@dataclass(frozen=True, slots=True)
class AttemptLease:
    """The lease an attempt already holds (a re-asked acquire gets it again)."""

    member: str
    lease_id: str
    epoch: int
    expiry_ms: int = 0
    """When the lease expires unless renewed (Redis clock); 0: unknown."""


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """One pool as read in one round trip; counts are of live entries only."""

    now_ms: int
    phase: Phase
    resident: str | None = None
    target: str | None = None
    from_member: str | None = None
    epoch: int = 0
    version: int = 0
    owner: str | None = None
    heartbeat_ms: int = 0
    started_ms: int = 0
    deadline_ms: int = 0
    committed_ms: int = 0
    """When the resident became resident (Redis clock)."""
    forced: bool = False
    parked: bool = False
    """An admin unloaded the pool: do not warm the default member until demand arrives."""
    unhealthy: bool = False
    """The resident failed its health checks while it still served (docs/adr/0005)."""
    relearn_ms: int = 0
    """Until then (Redis clock) the resident counts as busy: the store lost its leases and
    routers are renewing them back (docs/adr/0005)."""
    leases: Mapping[str, int] = field(default_factory=dict)
    waiters: Mapping[str, int] = field(default_factory=dict)
    failures: Mapping[str, int] = field(default_factory=dict)
    """member -> milliseconds left of its swap-failure backoff."""
    swap_times: tuple[float, ...] = ()
    attempt_lease: AttemptLease | None = None
    attempt_waiting: bool = False
    """The asking attempt is one of the pool's live waiters already."""

    def live_leases(self, member: str | None) -> int:
        return self.leases.get(member, 0) if member else 0

    @property
    def relearning(self) -> bool:
        return self.relearn_ms > self.now_ms

    def serving(self, member: str | None) -> bool:
        """``member`` has live leases, or may have ones the store is still relearning."""
        return member is not None and (
            self.live_leases(member) > 0 or (self.relearning and member == self.resident)
        )

    def live_waiters(self, member: str | None) -> int:
        return self.waiters.get(member, 0) if member else 0

    @property
    def total_waiters(self) -> int:
        return sum(self.waiters.values())


# --- writes ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SetState:
    """Update fields of the pool's state hash; ``bump`` moves its ``version``."""

    fields: Mapping[str, str]
    bump: bool = True


@dataclass(frozen=True, slots=True)
class AddLease:
    member: str
    lease_id: str
    expiry_ms: int
    attempt: str
    meta: str


@dataclass(frozen=True, slots=True)
class AddWaiter:
    member: str
    attempt: str
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class RemoveWaiter:
    member: str
    attempt: str


@dataclass(frozen=True, slots=True)
class ClearWaiters:
    member: str


@dataclass(frozen=True, slots=True)
class SetFailure:
    member: str
    reason: str
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class RecordSwapTime:
    seconds: float


@dataclass(frozen=True, slots=True)
class RevokeLeases:
    """Drop every lease on ``member``: renewals are refused, routers end their streams."""

    member: str


Op = (
    SetState
    | AddLease
    | AddWaiter
    | RemoveWaiter
    | ClearWaiters
    | SetFailure
    | RecordSwapTime
    | RevokeLeases
)


@dataclass(frozen=True, slots=True)
class Preconditions:
    """What must still hold when the writes are applied."""

    version: int | None = None
    state_equals: Mapping[str, str] = field(default_factory=dict)
    state_unknown: bool = False
    """The state hash is missing, or was written on another Redis server (only a rebuild
    writes then); otherwise every decision requires a state written on this server."""
    zero_leases: tuple[str, ...] = ()
    zero_waiters: tuple[str, ...] = ()
    waiter_cap: int | None = None
    """Total live waiters of the pool must stay below this."""


@dataclass(frozen=True, slots=True)
class SwapOrder:
    """Tells the caller to run (or resume) a swap as its owner."""

    target: str
    epoch: int
    from_member: str | None
    resume: bool = False
    loading: bool = False
    """Resumed in ``loading``: the target's load began under an earlier owner."""


@dataclass(frozen=True, slots=True)
class AuditIntent:
    outcome: PoolOutcome
    member: str | None = None
    from_member: str | None = None
    to_member: str | None = None
    epoch: int | None = None
    reason: str | None = None
    request_id: str | None = None


Reply = Granted | IncumbentBusyReply | WaitReply | ErrorReply


@dataclass(frozen=True, slots=True)
class Decision:
    reply: Reply | None = None
    ops: tuple[Op, ...] = ()
    pre: Preconditions = Preconditions()
    swap: SwapOrder | None = None
    audit: tuple[AuditIntent, ...] = ()
    need_idle_check: str | None = None
    """Member whose ``/slots`` must be consulted before deciding (busySignal leasesAndSlots)."""

    @property
    def writes(self) -> bool:
        return bool(self.ops)

    @property
    def changes_state(self) -> bool:
        return any(isinstance(op, SetState) and op.bump for op in self.ops)


NOTHING = Decision()


@dataclass(frozen=True, slots=True)
class AcquireAsk:
    member: str
    mode: PoolActivation
    attempt: str
    """The router's attempt: the key of the waiter and the lease."""
    request_id: str
    """The client's request id (audit only)."""
    router: str
    deadline_ms: int
    """When the router stops holding the request (Redis clock)."""
    lease_id: str
    """A fresh id the decision may use if it grants."""

    @classmethod
    def of(cls, request: AcquireRequest, *, now_ms: int, lease_id: str) -> AcquireAsk:
        """The router sends how long it holds the request; the deadline is anchored to the
        store's clock here (``now_ms``, Redis ``TIME``), never to any router's."""
        return cls(
            member=request.member,
            mode=request.mode,
            attempt=request.attempt,
            request_id=request.request_id,
            router=request.router,
            deadline_ms=now_ms + int(request.hold_s * 1000),
            lease_id=lease_id,
        )


# --- helpers --------------------------------------------------------------------------


def next_epoch(snap: PoolSnapshot) -> int:
    """Strictly above the last epoch, and above any epoch issued before Redis lost data."""
    return max(snap.epoch + 1, snap.now_ms)


def swap_estimate_s(snap: PoolSnapshot) -> float:
    if not snap.swap_times:
        return DEFAULT_SWAP_ESTIMATE_S
    return sum(snap.swap_times) / len(snap.swap_times)


def retry_after_s(snap: PoolSnapshot) -> float:
    """When the pool is likely to be warm for a new target: from measured swap times."""
    estimate = swap_estimate_s(snap)
    if snap.phase in IN_FLIGHT and snap.started_ms:
        estimate -= (snap.now_ms - snap.started_ms) / 1000
    return max(MIN_RETRY_AFTER_S, round(estimate, 3))


def incumbent_busy(snap: PoolSnapshot, policy: PoolPolicy, slots_busy: bool | None) -> bool:
    """Live leases fleet-wide, requests about to use it (its waiters), or busy slots."""
    if snap.resident is None:
        return False
    return (
        snap.serving(snap.resident)
        or (snap.live_waiters(snap.resident) > 0 and _just_committed(snap, policy))
        or slots_busy is True
    )


def _just_committed(snap: PoolSnapshot, policy: PoolPolicy) -> bool:
    return snap.now_ms - snap.committed_ms < policy.waiter_grace_ms


def _needs_slots(snap: PoolSnapshot, policy: PoolPolicy, slots_busy: bool | None) -> bool:
    return (
        snap.resident is not None
        and policy.busy_signal == BusySignal.LEASES_AND_SLOTS
        and slots_busy is None
    )


def _cap(snap: PoolSnapshot, policy: PoolPolicy) -> int | None:
    """The waiter cap precondition, unless this request already counts as a waiter."""
    return None if snap.attempt_waiting else policy.max_waiters


def _queue_full(snap: PoolSnapshot, policy: PoolPolicy) -> ErrorReply | None:
    if snap.attempt_waiting or snap.total_waiters < policy.max_waiters:
        return None
    return ErrorReply(
        code=ErrorCode.POOL_QUEUE_FULL,
        message=f"pool {policy.name} holds {snap.total_waiters} requests (maxWaiters)",
        retry_after_s=retry_after_s(snap),
    )


def _start_swap(
    snap: PoolSnapshot,
    policy: PoolPolicy,
    target: str,
    controller: str,
    *,
    forced: bool = False,
    reason: str = "demand",
) -> tuple[SetState, Preconditions, SwapOrder, AuditIntent]:
    epoch = next_epoch(snap)
    state = SetState(
        {
            "phase": Phase.UNLOADING.value,
            "target": target,
            "from": snap.resident or "",
            "resident": snap.resident or "",
            "epoch": str(epoch),
            "owner": controller,
            "heartbeat": str(snap.now_ms + policy.heartbeat_ttl_ms),
            "started": str(snap.now_ms),
            "deadline": str(snap.now_ms + policy.swap_timeout_ms),
            "forced": "1" if forced else "",
            "parked": "",
            "unhealthy": "",
            "relearn": "",
        }
    )
    busy_guard = (snap.resident,) if snap.resident else ()
    # The resident's waiters count as busy only just after its commit (incumbent_busy);
    # later they are strays (a router that died while held) and the decision ignores
    # them, so the precondition must too: requiring zero would fail every attempt until
    # the stray's deadline, and every decision for the pool would lose all its races.
    waiter_guard = busy_guard if _just_committed(snap, policy) else ()
    pre = Preconditions(version=snap.version, zero_leases=busy_guard, zero_waiters=waiter_guard)
    order = SwapOrder(target=target, epoch=epoch, from_member=snap.resident)
    audit = AuditIntent(
        PoolOutcome.SWAP_STARTED,
        member=target,
        from_member=snap.resident,
        to_member=target,
        epoch=epoch,
        reason=reason,
    )
    return state, pre, order, audit


# --- acquire --------------------------------------------------------------------------


def decide_acquire(
    snap: PoolSnapshot,
    ask: AcquireAsk,
    policy: PoolPolicy,
    controller: str,
    *,
    slots_busy: bool | None = None,
) -> Decision:
    """PRODUCT.md section 2, one acquire at a time."""
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
            ops=_withdraw(snap, ask),
        )
    if snap.resident == ask.member and snap.phase in {Phase.IDLE, Phase.DRAINING}:
        if snap.unhealthy:
            return _recovering(snap, ask, policy)
        return _grant(snap, ask, policy)
    if snap.phase in IN_FLIGHT:
        if ask.mode == PoolActivation.IF_IDLE and _swap_serves_others(snap, ask.member):
            # Held through this swap, the request would meet a target busy with the
            # requests it was loaded for, and be skipped then: tell it now.
            return _busy(snap, ask)
        if (full := _queue_full(snap, policy)) is not None:
            return Decision(reply=full)
        return Decision(
            reply=WaitReply(
                reason=WaitReason.SWAP_IN_FLIGHT,
                target=snap.target,
                epoch=snap.epoch,
                retry_after_s=retry_after_s(snap),
            ),
            ops=(AddWaiter(ask.member, ask.attempt, ask.deadline_ms),),
            pre=Preconditions(version=snap.version, waiter_cap=_cap(snap, policy)),
        )
    # The member is not resident, and no swap is in flight (idle or draining).
    if not incumbent_busy(snap, policy, slots_busy) and _needs_slots(snap, policy, slots_busy):
        return Decision(need_idle_check=snap.resident)
    if incumbent_busy(snap, policy, slots_busy):
        if ask.mode == PoolActivation.IF_IDLE:
            return _busy(snap, ask)
        if (full := _queue_full(snap, policy)) is not None:
            return Decision(reply=full)
        ops: list[Op] = [AddWaiter(ask.member, ask.attempt, ask.deadline_ms)]
        target = snap.target if snap.phase == Phase.DRAINING else ask.member
        if snap.phase == Phase.IDLE:
            ops.append(SetState({"phase": Phase.DRAINING.value, "target": ask.member}))
        return Decision(
            reply=WaitReply(
                reason=WaitReason.DRAINING,
                target=target,
                epoch=snap.epoch,
                retry_after_s=retry_after_s(snap),
            ),
            ops=tuple(ops),
            pre=Preconditions(version=snap.version, waiter_cap=_cap(snap, policy)),
        )
    # Incumbent idle, or the pool is cold: start the swap now (to the pending target, if
    # one is draining with demand, else to this member); this request waits for it.
    if (full := _queue_full(snap, policy)) is not None:
        return Decision(reply=full)
    target = ask.member
    if snap.phase == Phase.DRAINING and snap.target and snap.live_waiters(snap.target) > 0:
        target = snap.target
    state, pre, order, audit = _start_swap(snap, policy, target, controller)
    if target != ask.member and ask.mode == PoolActivation.IF_IDLE:
        # The drained GPU goes to the requests that waited for it; an IfIdle request for
        # another member starts that swap but is not held through it only to be skipped.
        return Decision(
            reply=IncumbentBusyReply(resident=snap.resident, retry_after_s=retry_after_s(snap)),
            ops=(state, *_withdraw(snap, ask)),
            pre=pre,
            swap=order,
            audit=(audit,),
        )
    return Decision(
        reply=WaitReply(
            reason=WaitReason.SWAP_IN_FLIGHT,
            target=target,
            epoch=order.epoch,
            retry_after_s=retry_after_s(snap),
        ),
        ops=(state, AddWaiter(ask.member, ask.attempt, ask.deadline_ms)),
        pre=Preconditions(
            version=pre.version,
            zero_leases=pre.zero_leases,
            zero_waiters=pre.zero_waiters,
            waiter_cap=_cap(snap, policy),
        ),
        swap=order,
        audit=(audit,),
    )


def _recovering(snap: PoolSnapshot, ask: AcquireAsk, policy: PoolPolicy) -> Decision:
    """The resident stopped answering while it serves: IfIdle goes elsewhere at once, Wait
    holds until it answers again or is replaced (never dispatched to a member in doubt)."""
    if ask.mode == PoolActivation.IF_IDLE:
        return _busy(snap, ask)
    if (full := _queue_full(snap, policy)) is not None:
        return Decision(reply=full)
    return Decision(
        reply=WaitReply(
            reason=WaitReason.RECOVERING,
            target=ask.member,
            epoch=snap.epoch,
            retry_after_s=retry_after_s(snap),
        ),
        ops=(AddWaiter(ask.member, ask.attempt, ask.deadline_ms),),
        pre=Preconditions(version=snap.version, waiter_cap=_cap(snap, policy)),
    )


def _swap_serves_others(snap: PoolSnapshot, member: str) -> bool:
    """The swap in flight loads another member for requests that wait for it."""
    return snap.target is not None and snap.target != member and snap.live_waiters(snap.target) > 0


def _busy(snap: PoolSnapshot, ask: AcquireAsk) -> Decision:
    """IfIdle: the GPU is (or is about to be) busy with another member; skip at once."""
    return Decision(
        reply=IncumbentBusyReply(resident=snap.resident, retry_after_s=retry_after_s(snap)),
        ops=_withdraw(snap, ask),
    )


def _withdraw(snap: PoolSnapshot, ask: AcquireAsk) -> tuple[Op, ...]:
    """A request that stops waiting (told busy or failed) leaves the waiters at once."""
    return (RemoveWaiter(ask.member, ask.attempt),) if snap.attempt_waiting else ()


def _grant(snap: PoolSnapshot, ask: AcquireAsk, policy: PoolPolicy) -> Decision:
    meta = json.dumps(
        {
            "member": ask.member,
            "attempt": ask.attempt,
            "request_id": ask.request_id,
            "router": ask.router,
            "epoch": snap.epoch,
        }
    )
    ops: list[Op] = [
        AddLease(ask.member, ask.lease_id, snap.now_ms + policy.lease_ttl_ms, ask.attempt, meta)
    ]
    if snap.attempt_waiting:
        ops.append(RemoveWaiter(ask.member, ask.attempt))
    return Decision(
        reply=Granted(lease_id=ask.lease_id, ttl_s=policy.lease_ttl_ms / 1000, epoch=snap.epoch),
        ops=tuple(ops),
        pre=Preconditions(version=snap.version),
    )


# --- supervisor tick -------------------------------------------------------------------


def _demand(snap: PoolSnapshot, policy: PoolPolicy) -> str | None:
    """The non-resident member with the most live waiters (ties: config order)."""
    best: str | None = None
    for member in policy.members:
        if member == snap.resident or snap.live_waiters(member) == 0:
            continue
        if best is None or snap.live_waiters(member) > snap.live_waiters(best):
            best = member
    return best


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
            if demand is not None:
                return Decision(
                    ops=(SetState({"target": demand}),), pre=Preconditions(version=snap.version)
                )
            return Decision(
                ops=(SetState({"phase": Phase.IDLE.value, "target": ""}),),
                pre=Preconditions(
                    version=snap.version, zero_waiters=(snap.target,) if snap.target else ()
                ),
                audit=(
                    AuditIntent(
                        PoolOutcome.SWAP_CANCELLED,
                        member=snap.target,
                        from_member=snap.resident,
                        to_member=snap.target,
                        epoch=snap.epoch,
                        reason="demand_gone_while_draining",
                    ),
                ),
            )
        demand = snap.target
    if demand is None:
        if (
            snap.resident is None
            and not snap.parked
            and policy.default
            and snap.failures.get(policy.default, 0) <= 0
        ):
            state, pre, order, audit = _start_swap(
                snap, policy, policy.default, controller, forced=True, reason="warm_default"
            )
            return Decision(ops=(state,), pre=pre, swap=order, audit=(audit,))
        return NOTHING
    if incumbent_busy(snap, policy, slots_busy):
        if snap.phase == Phase.IDLE:
            return Decision(
                ops=(SetState({"phase": Phase.DRAINING.value, "target": demand}),),
                pre=Preconditions(version=snap.version),
            )
        return NOTHING
    if _needs_slots(snap, policy, slots_busy):
        return Decision(need_idle_check=snap.resident)
    state, pre, order, audit = _start_swap(snap, policy, demand, controller)
    return Decision(ops=(state,), pre=pre, swap=order, audit=(audit,))


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
            SetState(
                {
                    "epoch": str(epoch),
                    "owner": controller,
                    "heartbeat": str(snap.now_ms + policy.heartbeat_ttl_ms),
                }
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


# --- swap steps (run by the swap's owner) ------------------------------------------------


def _owns(snap: PoolSnapshot, epoch: int, controller: str) -> bool:
    return snap.phase in IN_FLIGHT and snap.epoch == epoch and snap.owner == controller


def _ownership(epoch: int, controller: str) -> dict[str, str]:
    return {"epoch": str(epoch), "owner": controller}


def decide_heartbeat(
    snap: PoolSnapshot, policy: PoolPolicy, epoch: int, controller: str
) -> Decision | None:
    """Extend the owner's claim; ``None`` when the swap is no longer ours."""
    if not _owns(snap, epoch, controller):
        return None
    return Decision(
        ops=(SetState({"heartbeat": str(snap.now_ms + policy.heartbeat_ttl_ms)}, bump=False),),
        pre=Preconditions(state_equals=_ownership(epoch, controller)),
    )


def decide_begin_load(snap: PoolSnapshot, epoch: int, controller: str) -> Decision | None:
    """After the unloads: load the target, or cancel if its demand is gone."""
    if not _owns(snap, epoch, controller):
        return None
    if snap.phase == Phase.LOADING:
        return NOTHING  # taken over mid-load: the load that started runs to completion
    if snap.target is None:  # an unload-only swap (admin): nothing to load
        return Decision(
            ops=(SetState({"phase": Phase.LOADING.value}),),
            pre=Preconditions(state_equals=_ownership(epoch, controller)),
        )
    if not snap.forced and snap.live_waiters(snap.target) == 0:
        return Decision(
            ops=(_cold_state(),),
            pre=Preconditions(
                state_equals=_ownership(epoch, controller), zero_waiters=(snap.target,)
            ),
            audit=(
                AuditIntent(
                    PoolOutcome.SWAP_CANCELLED,
                    member=snap.target,
                    from_member=snap.from_member,
                    to_member=snap.target,
                    epoch=epoch,
                    reason="demand_gone_before_load",
                ),
            ),
        )
    return Decision(
        ops=(SetState({"phase": Phase.LOADING.value}),),
        pre=Preconditions(state_equals=_ownership(epoch, controller)),
    )


def _cold_state() -> SetState:
    return SetState(
        {
            "phase": Phase.IDLE.value,
            "resident": "",
            "target": "",
            "from": "",
            "owner": "",
            "forced": "",
        }
    )


def decide_commit(snap: PoolSnapshot, epoch: int, controller: str) -> Decision | None:
    """The target is ready (or, unload-only, everything is gone): it becomes the resident."""
    if not _owns(snap, epoch, controller):
        return None
    seconds = max(0.0, (snap.now_ms - snap.started_ms) / 1000)
    return Decision(
        ops=(
            SetState(
                {
                    "phase": Phase.IDLE.value,
                    "resident": snap.target or "",
                    "target": "",
                    "from": "",
                    "owner": "",
                    "forced": "",
                    "unhealthy": "",
                    "committed": str(snap.now_ms),
                }
            ),
            RecordSwapTime(seconds),
        ),
        pre=Preconditions(state_equals=_ownership(epoch, controller)),
        audit=(
            AuditIntent(
                PoolOutcome.SWAP_COMPLETED,
                member=snap.target,
                from_member=snap.from_member,
                to_member=snap.target,
                epoch=epoch,
            ),
        ),
    )


def decide_fail(
    snap: PoolSnapshot, policy: PoolPolicy, epoch: int, controller: str, reason: str
) -> Decision | None:
    """The swap failed or timed out (the target is already unloaded): pool cold, waiters told."""
    if not _owns(snap, epoch, controller):
        return None
    if snap.target is None:  # an unload-only swap failed: nothing is known to be resident
        return Decision(
            ops=(_cold_state(),),
            pre=Preconditions(state_equals=_ownership(epoch, controller)),
            audit=(
                AuditIntent(
                    PoolOutcome.SWAP_FAILED,
                    from_member=snap.from_member,
                    epoch=epoch,
                    reason=reason,
                ),
            ),
        )
    return Decision(
        ops=(
            _cold_state(),
            ClearWaiters(snap.target),
            SetFailure(snap.target, reason, policy.failure_backoff_ms),
        ),
        pre=Preconditions(state_equals=_ownership(epoch, controller)),
        audit=(
            AuditIntent(
                PoolOutcome.SWAP_FAILED,
                member=snap.target,
                from_member=snap.from_member,
                to_member=snap.target,
                epoch=epoch,
                reason=reason,
            ),
        ),
    )


def decide_resident_lost(
    snap: PoolSnapshot, member: str, reason: str, *, revoke: bool = False
) -> Decision:
    """The resident is dead out of band: forget it so the next acquire recovers.

    Never while it serves: without ``revoke`` the decision requires that the member has no
    live lease (and is not being relearned); with ``revoke`` (the driver confirmed it gone)
    its leases are dropped too, so renewals are refused and routers end their streams."""
    if snap.resident != member or snap.phase not in {Phase.IDLE, Phase.DRAINING}:
        return NOTHING
    if snap.serving(member) and not revoke:
        return NOTHING
    ops: list[Op] = [
        SetState(
            {
                "phase": Phase.IDLE.value,
                "resident": "",
                "target": "",
                "unhealthy": "",
                "relearn": "",
                "epoch": str(next_epoch(snap)),
            }
        )
    ]
    if revoke:
        ops.append(RevokeLeases(member))
    return Decision(
        ops=tuple(ops),
        pre=Preconditions(version=snap.version, zero_leases=() if revoke else (member,)),
        audit=(
            AuditIntent(PoolOutcome.RESIDENT_LOST, member=member, epoch=snap.epoch, reason=reason),
        ),
    )


def decide_resident_health(snap: PoolSnapshot, member: str, *, healthy: bool) -> Decision:
    """Mark (or clear) a resident that fails its health checks while it serves."""
    if snap.resident != member or snap.phase not in {Phase.IDLE, Phase.DRAINING}:
        return NOTHING
    if snap.unhealthy is not healthy:
        return NOTHING  # already as asked
    return Decision(
        ops=(SetState({"unhealthy": "" if healthy else "1"}),),
        pre=Preconditions(version=snap.version),
    )


def decide_rebuild(
    snap: PoolSnapshot,
    on_gpu: tuple[str, ...],
    *,
    unhealthy: bool = False,
    relearn_ms: int = 0,
) -> Decision:
    """State was lost (missing, or written on another Redis server): take residency from
    what the drivers report as running (``on_gpu``; a lone member is the resident, marked
    ``unhealthy`` when it does not answer yet: still loading, or stalled under streams),
    and count the resident busy for ``relearn_ms`` while routers renew the leases the
    store forgot. (The store records which server the new state is written on.)"""
    if snap.phase != Phase.UNKNOWN:
        return NOTHING
    resident = on_gpu[0] if len(on_gpu) == 1 else ""
    return Decision(
        ops=(
            SetState(
                {
                    "phase": Phase.IDLE.value,
                    "resident": resident,
                    "target": "",
                    "from": "",
                    "owner": "",
                    "forced": "",
                    "parked": "",
                    "unhealthy": "1" if resident and unhealthy else "",
                    "relearn": str(snap.now_ms + relearn_ms) if resident else "",
                    "epoch": str(next_epoch(snap)),
                }
            ),
        ),
        pre=Preconditions(state_unknown=True),
    )


# --- admin actions ----------------------------------------------------------------------


def decide_admin_swap(
    snap: PoolSnapshot,
    member: str,
    controller: str,
    policy: PoolPolicy,
    *,
    slots_busy: bool | None = None,
) -> Decision:
    """An operator forces ``member`` in. Refused while a swap runs or the incumbent serves
    (live leases, or busy ``/slots`` under ``busySignal: leasesAndSlots``)."""
    if member not in policy.members:
        return Decision(
            reply=ErrorReply(code=ErrorCode.UNKNOWN_MEMBER, message=f"no member {member!r}")
        )
    if snap.phase == Phase.UNKNOWN or snap.phase in IN_FLIGHT:
        return Decision(
            reply=ErrorReply(code=ErrorCode.SWAP_IN_FLIGHT, message=f"pool is {snap.phase.value}")
        )
    if snap.resident == member:
        return Decision(
            reply=WaitReply(
                reason=WaitReason.SWAP_IN_FLIGHT, target=None, epoch=snap.epoch, retry_after_s=0
            )
        )
    refused = _admin_refusal(snap, policy, slots_busy)
    if refused is not None:
        return refused
    state, _, order, audit = _start_swap(
        snap, policy, member, controller, forced=True, reason="admin"
    )
    busy_guard = (snap.resident,) if snap.resident else ()
    return Decision(
        reply=WaitReply(
            reason=WaitReason.SWAP_IN_FLIGHT,
            target=member,
            epoch=order.epoch,
            retry_after_s=retry_after_s(snap),
        ),
        ops=(state,),
        pre=Preconditions(version=snap.version, zero_leases=busy_guard),
        swap=order,
        audit=(audit,),
    )


def _admin_refusal(
    snap: PoolSnapshot, policy: PoolPolicy, slots_busy: bool | None
) -> Decision | None:
    """Why an admin swap or unload must not cut the incumbent now (None: it may)."""
    if snap.live_leases(snap.resident) > 0:
        return Decision(
            reply=ErrorReply(
                code=ErrorCode.INCUMBENT_BUSY,
                message=f"{snap.resident} holds {snap.live_leases(snap.resident)} live lease(s)",
            )
        )
    if snap.serving(snap.resident):
        return Decision(
            reply=ErrorReply(
                code=ErrorCode.INCUMBENT_BUSY,
                message=f"{snap.resident} may still serve: the store lost its leases and is "
                "relearning them (one lease TTL after the rebuild)",
            )
        )
    if _needs_slots(snap, policy, slots_busy):
        return Decision(need_idle_check=snap.resident)
    if slots_busy is True and snap.resident is not None:
        return Decision(
            reply=ErrorReply(
                code=ErrorCode.INCUMBENT_BUSY,
                message=f"{snap.resident}'s /slots reports requests in progress",
            )
        )
    return None


def decide_admin_unload(
    snap: PoolSnapshot, controller: str, policy: PoolPolicy, *, slots_busy: bool | None = None
) -> Decision:
    """An operator empties the GPU: unload the resident, then stay cold until demand.
    Refused while a swap runs or the incumbent serves, as for an admin swap."""
    if snap.phase == Phase.UNKNOWN or snap.phase in IN_FLIGHT:
        return Decision(
            reply=ErrorReply(code=ErrorCode.SWAP_IN_FLIGHT, message=f"pool is {snap.phase.value}")
        )
    refused = _admin_refusal(snap, policy, slots_busy)
    if refused is not None:
        return refused
    epoch = next_epoch(snap)
    busy_guard = (snap.resident,) if snap.resident else ()
    return Decision(
        reply=WaitReply(
            reason=WaitReason.SWAP_IN_FLIGHT,
            target=None,
            epoch=epoch,
            retry_after_s=retry_after_s(snap),
        ),
        ops=(
            SetState(
                {
                    "phase": Phase.UNLOADING.value,
                    "target": "",
                    "from": snap.resident or "",
                    "epoch": str(epoch),
                    "owner": controller,
                    "heartbeat": str(snap.now_ms + policy.heartbeat_ttl_ms),
                    "started": str(snap.now_ms),
                    "deadline": str(snap.now_ms + policy.swap_timeout_ms),
                    "forced": "1",
                    "parked": "1",
                }
            ),
        ),
        pre=Preconditions(version=snap.version, zero_leases=busy_guard),
        swap=SwapOrder(target="", epoch=epoch, from_member=snap.resident),
        audit=(
            AuditIntent(
                PoolOutcome.SWAP_STARTED,
                member=snap.resident,
                from_member=snap.resident,
                epoch=epoch,
                reason="admin_unload",
            ),
        ),
    )
