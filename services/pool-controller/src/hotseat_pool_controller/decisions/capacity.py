"""Capacity pools (docs/adr/0008): the residency set, and the plan that changes it.

A capacity pool keeps a *residency set* (the members loaded and serving) within its
memory, and at most one *plan* in flight: the members it evicts (unloading) and the member
it loads, under one epoch, owner and heartbeat, exactly as a one-resident pool keeps its
swap (the same runner, takeover and fencing; docs/adr/0005). The decisions here are pure
functions of a snapshot; the acquire, tick and admin decisions call them when the pool
has a capacity.

- A member of the set is granted at once, in every phase.
- A member being loaded or evicted: the request waits, in both modes.
- A member absent, no plan in flight: if it fits in the free memory the plan evicts
  nothing; otherwise it evicts idle members (no live lease, no waiter just granted, and
  under ``busySignal: leasesAndSlots`` its ``/slots`` read idle), never pinned ones,
  cheapest first (a copy beyond demand, docs/adr/0012, then expected reload time, then
  fewest requests lately, then least recently used), and only as many as needed. If no
  idle set frees enough, the pool drains toward it: Wait holds, IfIdle is told
  ``incumbent_busy`` at once. With ``maxWait``, once its most urgent waiter has waited
  that long, the residents of the
  cheapest set that makes room (busy ones included, once resident ``minResidency``)
  are closed: no new lease for them; they drain, and the plan evicts them.
- Several loads at once: a plan also loads, beside its target and at the same time, the
  other absent members with waiters that fit in the memory it leaves free (most urgent
  first; it evicts nothing more for them). Each joins the set as soon as it is loaded.
- Never over capacity: the plan's evicts leave the set when it starts and are confirmed
  gone before its loads begin; the loads that start fit beside the set together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hotseat_common.config.model import PoolActivation
from hotseat_common.errors import ErrorCode
from hotseat_common.messages import (
    ErrorReply,
    IncumbentBusyReply,
    PoolOutcome,
    SwapReason,
    WaitReason,
    WaitReply,
)
from hotseat_pool_controller.decisions.busy import (
    NOT_READ,
    SlotsRead,
    at_work,
    busy_in_service,
    unread,
)
from hotseat_pool_controller.decisions.hold import (
    hold,
    over_budget,
    queue_full,
    retry_after_s,
    waiter_cap,
    withdraw,
)
from hotseat_pool_controller.decisions.schedule import (
    close_due,
    may_close,
    most_urgent,
    ranked,
    swap_s,
)
from hotseat_pool_controller.decisions.start import SwapStart, claim, forget_cause
from hotseat_pool_controller.model import (
    IN_FLIGHT,
    NOTHING,
    AcquireAsk,
    AddWaiter,
    AuditIntent,
    Decision,
    Op,
    Phase,
    PoolPolicy,
    PoolSnapshot,
    Preconditions,
    RecordDrainTime,
    RevokeLeases,
    SetState,
    SwapOrder,
)
from hotseat_pool_controller.store.codec import KEEP, mark_loaded, set_state

EPSILON_GIB = 1e-9


@dataclass(frozen=True, slots=True)
class Plan:
    """What loading a member takes: the residents it evicts (none when it fits), and the
    other members it loads beside it at the same time (``also``), which fit in the memory
    it leaves free."""

    target: str | None
    evicts: tuple[str, ...]
    also: tuple[str, ...] = ()

    @property
    def reason(self) -> SwapReason:
        return SwapReason.EVICT_IDLE if self.evicts else SwapReason.FITS


# --- memory -------------------------------------------------------------------------


def held_gib(snap: PoolSnapshot, policy: PoolPolicy) -> float:
    """The memory the members may hold right now: resident, still to confirm gone (being
    evicted, or left by a failed plan or a loss), or loading (a plan's target loads only
    once its evicts are gone: in ``unloading`` it holds nothing yet; so do the members it
    loads beside it)."""
    members = set(snap.residents) | set(snap.evicts)
    if snap.phase == Phase.LOADING and snap.target:
        members |= {snap.target, *snap.also}
    return sum(policy.gib(m) for m in members)


def free_gib(snap: PoolSnapshot, policy: PoolPolicy) -> float:
    return (policy.capacity_gib or 0.0) - held_gib(snap, policy)


def member_idle(
    snap: PoolSnapshot, policy: PoolPolicy, member: str, slots: SlotsRead = NOT_READ
) -> bool:
    """No live lease (nor any the store may be relearning), no ``/slots`` read busy, and
    no waiter that is re-asking right after it was loaded or used (a stray waiter of a
    dead router, long after, does not pin it; nor does one held because ``maxWait``
    closed the member: it waits for it to go and come back)."""
    if snap.serving(member) or busy_in_service(slots, member):
        return False
    if member in snap.closing:
        return True
    recently = snap.now_ms - snap.used.get(member, 0) < policy.waiter_grace_ms
    return not (snap.live_waiters(member) > 0 and recently)


def reload_cost_s(snap: PoolSnapshot, member: str) -> int:
    """A member's expected reload time in whole seconds, rounded up (its measured swaps;
    unmeasured counts as free): measurements a few milliseconds apart are the same cost,
    and recency decides between them."""
    return math.ceil(swap_s(snap, member) or 0.0)


def recent_demand(snap: PoolSnapshot, policy: PoolPolicy, member: str) -> float:
    """The requests ``member``'s leases served lately: each counts one, halved every
    ``demand_half_life_ms`` since (0 when not counted)."""
    count, as_of = snap.demand.get(member, (0.0, snap.now_ms))
    if policy.demand_half_life_ms <= 0:
        return 0.0
    return count * math.pow(0.5, max(0, snap.now_ms - as_of) / policy.demand_half_life_ms)


def eviction_cost(
    snap: PoolSnapshot, policy: PoolPolicy, member: str
) -> tuple[bool, int, int, int, str]:
    """The order in which residents are evicted, cheapest first: a copy beyond demand
    (``snap.surplus``: its model group is resident on another pool too, docs/adr/0012)
    before a sole copy, then the shortest expected
    reload (:func:`reload_cost_s`), then the fewest requests lately
    (:func:`recent_demand`, in whole requests: the member least likely to be asked for
    again soon), then least recently used."""
    demand = round(recent_demand(snap, policy, member))
    sole = member not in snap.surplus
    return (sole, reload_cost_s(snap, member), demand, snap.used.get(member, 0), member)


def evictable(policy: PoolPolicy, member: str) -> bool:
    """Never a pinned member, nor the default."""
    return member not in policy.pinned and member != policy.default


def eviction_order(
    snap: PoolSnapshot, policy: PoolPolicy, slots: SlotsRead = NOT_READ
) -> list[str]:
    """The residents that may be evicted now (idle, evictable), cheapest first."""
    candidates = [
        m for m in snap.residents if evictable(policy, m) and member_idle(snap, policy, m, slots)
    ]
    return sorted(candidates, key=lambda m: eviction_cost(snap, policy, m))


def _free_beside_residents(snap: PoolSnapshot, policy: PoolPolicy) -> float:
    return (policy.capacity_gib or 0.0) - sum(policy.gib(m) for m in snap.residents)


def _enough(
    policy: PoolPolicy, need: float, free: float, order: list[str]
) -> tuple[str, ...] | None:
    """The members of ``order`` taken in turn until ``need`` fits beside ``free``, then
    sparing any taken early that the rest make unnecessary (a cheap member taken first may
    be spared by a larger one); ``None`` when all of them are not enough."""
    chosen: list[str] = []
    for member in order:
        chosen.append(member)
        free += policy.gib(member)
        if need <= free + EPSILON_GIB:
            break
    else:
        return None
    for member in list(chosen[:-1]):
        if need <= free - policy.gib(member) + EPSILON_GIB:
            chosen.remove(member)
            free -= policy.gib(member)
    return tuple(chosen)


def make_plan(
    snap: PoolSnapshot, policy: PoolPolicy, target: str, slots: SlotsRead = NOT_READ
) -> Plan | None:
    """The plan that loads ``target`` now (no plan is in flight): nothing evicted when it
    fits, else idle members in eviction order, only as many as needed; ``None`` when no
    idle set frees enough (busy members would have to go: the pool drains). Under
    ``busySignal: leasesAndSlots`` a plan is started only once the ``/slots`` of each
    member it evicts were read idle (:func:`read_first`)."""
    need = policy.gib(target)
    # Members still to confirm gone (left by a failed plan or a loss) serve no router:
    # every plan unloads them first (start_plan), so their memory is free for its load;
    # unless one is at work for traffic that bypassed the router (its /slots read busy):
    # then no plan starts until it is idle.
    if any(at_work(slots, m) for m in snap.evicts):
        return None
    free = _free_beside_residents(snap, policy)
    if need <= free + EPSILON_GIB:
        return _with_others(snap, policy, Plan(target, ()))
    chosen = _enough(policy, need, free, eviction_order(snap, policy, slots))
    return None if chosen is None else _with_others(snap, policy, Plan(target, chosen))


def _with_others(snap: PoolSnapshot, policy: PoolPolicy, plan: Plan) -> Plan:
    """``plan``, loading beside its target the other absent members with live waiters
    (most urgent first, none in its failure backoff nor still to confirm gone) that fit
    in the memory it leaves free: the set less its evicts, its target, and the members
    taken before; it evicts nothing more for them. Their sum with the set's is checked
    here, so the loads that start together never go over the capacity."""
    if plan.target is None:
        return plan
    free = _free_beside_residents(snap, policy) - policy.gib(plan.target)
    free += sum(policy.gib(m) for m in plan.evicts)
    others = frozenset(policy.members) - snap.residents - {plan.target} - set(snap.evicts)
    also: list[str] = []
    for member in ranked(snap, among=others):
        if snap.failures.get(member, 0) > 0:
            continue
        if policy.gib(member) <= free + EPSILON_GIB:
            also.append(member)
            free -= policy.gib(member)
    return Plan(plan.target, plan.evicts, tuple(also))


def closing_now(
    snap: PoolSnapshot, policy: PoolPolicy, target: str, slots: SlotsRead = NOT_READ
) -> frozenset[str] | None:
    """``maxWait`` (docs/adr/0006, 0008): ``target`` does not fit beside the idle
    residents, and its most urgent waiter's wait plus the expected drain of the members
    that make room for it reaches ``maxWait`` (``schedule.close_due``, as a one-resident
    pool's close): the pool closes the residents of the cheapest set that makes room for
    it, busy ones included (those closed already first, then the idle ones, then the busy
    ones, each by :func:`eviction_cost`; only as many as needed). A busy member is a
    candidate as far as its own demand lets it (``schedule.may_close``, from its commit:
    ``minResidency``, unless the waiter was in line before that commit; not while the
    waiters it was loaded for re-ask, unless the waiter ranks ahead of them). Returns the
    pool's closed set with them, ``None`` when nothing more closes now (no ``maxWait``,
    not due yet, or no set frees enough yet)."""
    if policy.max_wait_ms is None or not close_due(snap, policy, target, snap.residents):
        return None  # not even with the longest drain of any resident

    def closable(member: str) -> bool:
        if not evictable(policy, member):
            return False
        if member in snap.closing or member_idle(snap, policy, member, slots):
            return True
        return may_close(snap, policy, target, member, snap.loaded.get(member, 0))

    order = sorted(
        (m for m in snap.residents if closable(m)),
        key=lambda m: (
            m not in snap.closing,
            not member_idle(snap, policy, m, slots),
            *eviction_cost(snap, policy, m),
        ),
    )
    chosen = _enough(policy, policy.gib(target), _free_beside_residents(snap, policy), order)
    if chosen is None or set(chosen) <= snap.closing:
        return None
    if not close_due(snap, policy, target, chosen):
        return None
    return snap.closing | set(chosen)


def close(snap: PoolSnapshot, closing: frozenset[str]) -> SetState:
    """The pool's closed set becomes ``closing``; the moment of its first close is kept
    (``closedat``) to measure the drain of each member the plan then evicts (:func:`drains`;
    a member closed later is measured from that first close: an overestimate, which only
    closes it sooner next time)."""
    return set_state(closing=closing, closed_ms=KEEP if snap.closing else snap.now_ms)


def drains(snap: PoolSnapshot, evicts: tuple[str, ...]) -> tuple[Op, ...]:
    """A plan starts: how long each closed member it evicts that was serving at the close
    took to drain, from the close to the release of its last lease (``used.<member>``;
    the plan itself may start later, once the other members drained too); a member idle
    at the close drained at once and records nothing. Recorded with the start (a start
    refused and taken again records nothing twice: the same write clears the close)."""
    if not snap.closed_ms:
        return ()
    return tuple(
        RecordDrainTime(m, (snap.used[m] - snap.closed_ms) / 1000)
        for m in evicts
        if m in snap.closing and snap.used.get(m, 0) >= snap.closed_ms
    )


def closing_at_commit(snap: PoolSnapshot, policy: PoolPolicy) -> SetState | None:
    """A plan's commit closes the residents the most urgent absent member needs, the
    target just loaded among them, when a close is due for it at once (docs/adr/0006: a
    waiter in line before the commit, or one of a higher priority that came during the
    load, ranks ahead of the requests the target was loaded for): the pool drains toward
    it from the commit, so not one of those requests is granted first (they wake at the
    commit and would take the one-round-trip grant). ``snap``: the pool as it is before
    the commit; ``None``: the set opens as usual (a later tick or acquire closes what
    comes due)."""
    target = snap.target
    if policy.max_wait_ms is None or target is None or target in snap.evicts:
        return None
    after = replace(
        snap,
        phase=Phase.IDLE,
        target=None,
        also=(),
        residents=snap.residents | {target},
        loaded={**snap.loaded, target: snap.now_ms},
        used={**snap.used, target: snap.now_ms},
    )
    demand = most_urgent(after, among=_absent(after, policy))
    if demand is None or make_plan(after, policy, demand) is not None:
        return None
    closing = closing_now(after, policy, demand)
    if closing is None or target not in closing:
        return None
    return set_state(phase=Phase.DRAINING, target=demand, cause=None).merged(close(snap, closing))


def read_first(
    snap: PoolSnapshot, policy: PoolPolicy, slots: SlotsRead, plan: Plan
) -> Decision | None:
    """The ``/slots`` reads ``plan`` still needs before it may start (``None``: none):
    every member it unloads, the ones still to confirm gone included."""
    members = unread(policy, slots, tuple(dict.fromkeys((*plan.evicts, *snap.evicts))))
    return Decision(need_idle_check=members) if members else None


# --- starting a plan ----------------------------------------------------------------


def start_plan(
    snap: PoolSnapshot,
    policy: PoolPolicy,
    controller: str,
    plan: Plan,
    *,
    reason: SwapReason | None = None,
    forced: bool = False,
    cause: str | None = None,
) -> SwapStart:
    """The plan in flight from now: its evicts leave the residency set (no new lease for
    them), under a new epoch owned by ``controller``, on the condition that the state did
    not move and the evicts still have no live lease. ``cause``: the request that starts
    it; by default, for a drain's target, the request that began the drain."""
    unload_only = plan.target is None
    # Members a failed plan or a loss left unconfirmed are unloaded by this one first (its
    # own target too: a member lost while stalled is stopped before it is loaded afresh).
    leftovers = tuple(m for m in snap.evicts if m not in plan.evicts)
    plan = Plan(plan.target, (*plan.evicts, *leftovers), plan.also)
    first = plan.evicts[0] if plan.evicts else None
    started = claim(snap, policy, controller, plan.target, first, forced=forced, cause=cause)
    epoch, swap_id = started.epoch, started.swap_id
    state = started.state.merged(
        set_state(
            residents=snap.residents - set(plan.evicts),
            evicts=plan.evicts,
            also=plan.also,
            parked=unload_only and reason == SwapReason.ADMIN_UNLOAD,
            closed=False,
            closing=frozenset(),
            closed_ms=None if snap.closed_ms else KEEP,
        )
    )
    guard = Preconditions(version=snap.version, zero_leases=plan.evicts)
    audit = AuditIntent(
        PoolOutcome.SWAP_STARTED,
        member=plan.target or (plan.evicts[0] if plan.evicts else None),
        from_member=plan.evicts[0] if plan.evicts else None,
        to_member=plan.target,
        epoch=epoch,
        reason=reason or plan.reason,
        request_id=started.cause,
        evicts=plan.evicts,
        also=plan.also,
        swap_id=swap_id,
    )
    order = SwapOrder(
        target=plan.target or "",
        epoch=epoch,
        from_member=plan.evicts[0] if plan.evicts else None,
        evicts=plan.evicts,
        swap_id=swap_id,
    )
    return SwapStart(state, guard, order, audit, drains(snap, plan.evicts))


# --- acquire ------------------------------------------------------------------------


def decide_capacity_acquire(  # noqa: PLR0911, PLR0917 - one answer per case of the set
    snap: PoolSnapshot,
    ask: AcquireAsk,
    policy: PoolPolicy,
    controller: str,
    grant: Decision,
    slots: SlotsRead = NOT_READ,
) -> Decision:
    """One acquire in a capacity pool (``grant``: the decision that grants it; ``slots``:
    the ``/slots`` read so far)."""
    member = ask.member
    if member in snap.residents:
        return _for_resident(snap, ask, policy, grant)
    if snap.phase in IN_FLIGHT:
        if member == snap.target or member in snap.evicts or member in snap.also:
            return hold(snap, ask, policy, WaitReason.SWAP_IN_FLIGHT, target=snap.target)
        if ask.mode == PoolActivation.IF_IDLE and not _fits_after_plan(snap, policy, member):
            return _busy(snap, ask)
        return hold(snap, ask, policy, WaitReason.SWAP_IN_FLIGHT, target=snap.target)
    first = snap.target
    if (
        snap.phase == Phase.DRAINING
        and first is not None
        and first != member
        and snap.live_waiters(first) > 0
    ):
        return _behind_drain(snap, ask, policy, controller, first, slots)
    plan = make_plan(snap, policy, member, slots)
    if plan is not None and (check := read_first(snap, policy, slots, plan)) is not None:
        return check
    if plan is None:
        return _drain_toward(snap, ask, policy, slots)
    start = start_plan(snap, policy, controller, plan, cause=ask.request_id)
    return _hold_with(snap, ask, policy, start)


def _drain_toward(
    snap: PoolSnapshot, ask: AcquireAsk, policy: PoolPolicy, slots: SlotsRead
) -> Decision:
    """No idle set makes room for the member: IfIdle is told busy at once; Wait holds
    while the pool drains toward it (and, once it waited ``maxWait``, the request closes
    the residents its plan needs, when it is the first to see that the time has come)."""
    if ask.mode == PoolActivation.IF_IDLE:
        return _busy(snap, ask)
    member = ask.member
    also: tuple[Op, ...] = ()
    if snap.phase != Phase.DRAINING or snap.target != member:
        also = (set_state(phase=Phase.DRAINING, target=member, cause=ask.request_id),)
    elif (closing := closing_now(snap, policy, member, slots)) is not None:
        also = (close(snap, closing),)
    return hold(snap, ask, policy, WaitReason.DRAINING, target=member, also=also)


def _for_resident(
    snap: PoolSnapshot, ask: AcquireAsk, policy: PoolPolicy, grant: Decision
) -> Decision:
    """Granted at once, unless it stopped answering while it serves: IfIdle goes
    elsewhere, Wait holds until it answers again or is replaced (docs/adr/0005 point 4,
    per member); or unless ``maxWait`` closed it: IfIdle goes elsewhere, Wait holds for
    its swap back."""
    if ask.member not in snap.unwell and ask.member not in snap.closing:
        return grant
    if ask.mode == PoolActivation.IF_IDLE:
        return _busy(snap, ask)
    if ask.member in snap.unwell:
        return hold(snap, ask, policy, WaitReason.RECOVERING, target=ask.member)
    return hold(snap, ask, policy, WaitReason.CLOSED, target=snap.target)


def _behind_drain(  # noqa: PLR0917 - the acquire's own arguments, passed on
    snap: PoolSnapshot,
    ask: AcquireAsk,
    policy: PoolPolicy,
    controller: str,
    first: str,
    slots: SlotsRead,
) -> Decision:
    """The pool drains toward ``first``, whose waiters came first: its plan starts now if
    it can, and this request waits behind it (IfIdle only when it will fit beside it,
    else it is told busy at once, ADR 0005 point 7)."""
    plan = make_plan(snap, policy, first, slots)
    if plan is not None and (check := read_first(snap, policy, slots, plan)) is not None:
        return check
    if plan is None:
        if ask.mode == PoolActivation.IF_IDLE:
            return _busy(snap, ask)
        return hold(snap, ask, policy, WaitReason.DRAINING, target=first)
    start = start_plan(snap, policy, controller, plan)
    if ask.mode == PoolActivation.IF_IDLE and not _fits_beside(snap, policy, plan, ask.member):
        busy = IncumbentBusyReply(resident=first, retry_after_s=retry_after_s(snap))
        return start.decision(busy, also=withdraw(snap, ask))
    return _hold_with(snap, ask, policy, start)


def _hold_with(
    snap: PoolSnapshot, ask: AcquireAsk, policy: PoolPolicy, start: SwapStart
) -> Decision:
    """Start the plan, and hold the request as a waiter for its member."""
    if (full := queue_full(snap, policy)) is not None:
        return Decision(reply=full)
    if (late := over_budget(snap, ask, policy)) is not None:
        return late
    return start.decision(
        start.wait_reply(snap),
        also=(AddWaiter(ask.member, ask.attempt, ask.deadline_ms, ask.urgency_ms(policy)),),
        pre=waiter_cap(snap, policy, start.guard),
    )


def _fits_after_plan(snap: PoolSnapshot, policy: PoolPolicy, member: str) -> bool:
    """Once the plan in flight commits, ``member`` fits without evicting anything."""
    after = held_gib(snap, policy) + policy.gib(member)
    if snap.phase == Phase.UNLOADING:
        after += policy.gib(snap.target) + sum(policy.gib(m) for m in snap.also)
        after -= sum(policy.gib(m) for m in snap.evicts)
    return after <= (policy.capacity_gib or 0.0) + EPSILON_GIB


def _fits_beside(snap: PoolSnapshot, policy: PoolPolicy, plan: Plan, member: str) -> bool:
    """After ``plan``, ``member`` fits without evicting anything."""
    held = sum(policy.gib(m) for m in snap.residents if m not in plan.evicts)
    held += policy.gib(plan.target) + sum(policy.gib(m) for m in plan.also)
    return policy.gib(member) + held <= (policy.capacity_gib or 0.0) + EPSILON_GIB


def _busy(snap: PoolSnapshot, ask: AcquireAsk) -> Decision:
    """IfIdle: the memory it needs is (or is about to be) busy; skip at once."""
    busiest = max(sorted(snap.residents), key=snap.live_leases, default=None)
    return Decision(
        reply=IncumbentBusyReply(resident=busiest, retry_after_s=retry_after_s(snap)),
        ops=withdraw(snap, ask),
    )


# --- tick ---------------------------------------------------------------------------


def decide_capacity_tick(  # noqa: PLR0911 - one move per state of the set
    snap: PoolSnapshot, policy: PoolPolicy, controller: str, slots: SlotsRead = NOT_READ
) -> Decision:
    """Move a capacity pool forward without a request (no plan in flight): the most urgent
    absent member's plan, or drain toward it; else warm the pinned and default members,
    and unload residents idle for their ``idleUnloadAfter``."""
    for member in sorted(snap.unwell):
        if not snap.serving(member):  # its last lease ended: now it can be recovered
            return decide_member_lost(snap, member, "unhealthy, and its last lease ended")
    demand = most_urgent(snap, among=_absent(snap, policy))
    if snap.phase == Phase.DRAINING and (
        snap.target is None or snap.live_waiters(snap.target) == 0 or demand != snap.target
    ):
        return _retarget(snap, demand)
    if demand is not None:
        plan = make_plan(snap, policy, demand, slots)
        if plan is not None:
            check = read_first(snap, policy, slots, plan)
            return check or start_plan(snap, policy, controller, plan).decision()
        closing = closing_now(snap, policy, demand, slots)
        if snap.phase == Phase.IDLE:
            return Decision(
                ops=(
                    set_state(phase=Phase.DRAINING, target=demand, cause=forget_cause(snap)).merged(
                        set_state() if closing is None else close(snap, closing)
                    ),
                ),
                pre=Preconditions(version=snap.version),
            )
        if closing is not None:
            return Decision(ops=(close(snap, closing),), pre=Preconditions(version=snap.version))
        return NOTHING
    if (warm := _warm(snap, policy, controller, slots)) is not None:
        return warm
    if snap.evicts:  # left over by a failed plan: unloaded before anything else loads
        return _unload_leftovers(snap, policy, controller, slots)
    return _idle_unload(snap, policy, controller, slots)


def _unload_leftovers(
    snap: PoolSnapshot, policy: PoolPolicy, controller: str, slots: SlotsRead
) -> Decision:
    """Members a failed plan or a loss left to confirm gone are unloaded, unless one is
    at work for traffic that bypassed the router (then a later tick tries again)."""
    leftovers = Plan(None, ())
    if (check := read_first(snap, policy, slots, leftovers)) is not None:
        return check
    if any(at_work(slots, m) for m in snap.evicts):
        return NOTHING
    return start_plan(snap, policy, controller, leftovers).decision()


def _absent(snap: PoolSnapshot, policy: PoolPolicy) -> frozenset[str]:
    return frozenset(policy.members) - snap.residents


def _retarget(snap: PoolSnapshot, demand: str | None) -> Decision:
    """Drain toward the most urgent absent member now, or, with none left, stop; the
    members closed for the old target open again (a new one closes its own)."""
    if demand is not None:
        return Decision(
            ops=(
                set_state(
                    target=demand, cause=forget_cause(snap), closing=frozenset(), closed_ms=None
                ),
            ),
            pre=Preconditions(version=snap.version),
        )
    return Decision(
        ops=(
            set_state(
                phase=Phase.IDLE,
                target=None,
                cause=forget_cause(snap),
                closing=frozenset(),
                closed_ms=None,
            ),
        ),
        pre=Preconditions(version=snap.version, zero_waiters=(snap.target,) if snap.target else ()),
        audit=(
            AuditIntent.of_swap(
                PoolOutcome.SWAP_CANCELLED,
                snap.target,
                None,
                snap.epoch,
                "demand_gone_while_draining",
            ),
        ),
    )


def _warm(
    snap: PoolSnapshot, policy: PoolPolicy, controller: str, slots: SlotsRead
) -> Decision | None:
    """The pinned members and the default are kept resident (loaded at start, and again
    after a loss), unless an admin unloaded the pool."""
    if snap.parked:
        return None
    wanted = sorted(policy.pinned | ({policy.default} if policy.default else set()))
    for member in wanted:
        if member in snap.residents or snap.failures.get(member, 0) > 0:
            continue
        plan = make_plan(snap, policy, member, slots)
        if plan is not None:
            return (
                read_first(snap, policy, slots, plan)
                or start_plan(
                    snap, policy, controller, plan, reason=SwapReason.WARM_DEFAULT, forced=True
                ).decision()
            )
    return None


def _idle_unload(
    snap: PoolSnapshot, policy: PoolPolicy, controller: str, slots: SlotsRead
) -> Decision:
    """Residents that served nothing for their ``idleUnloadAfter`` are unloaded (never a
    pinned member or the default)."""
    due = tuple(
        sorted(
            m
            for m in snap.residents
            if m in policy.idle_unload_ms
            and m not in policy.pinned
            and m != policy.default
            and member_idle(snap, policy, m, slots)
            and snap.live_waiters(m) == 0
            and snap.now_ms - snap.used.get(m, 0) >= policy.idle_unload_ms[m]
        )
    )
    if not due:
        return NOTHING
    plan = Plan(None, due)
    return (
        read_first(snap, policy, slots, plan)
        or start_plan(snap, policy, controller, plan, reason=SwapReason.IDLE_UNLOAD).decision()
    )


# --- admin --------------------------------------------------------------------------


def decide_capacity_admin_swap(
    snap: PoolSnapshot,
    member: str,
    controller: str,
    policy: PoolPolicy,
    slots: SlotsRead = NOT_READ,
) -> Decision:
    """An operator loads ``member``, evicting idle members as a request would (refused
    when only busy ones could make room)."""
    if member in snap.residents:
        return Decision(
            reply=WaitReply(
                reason=WaitReason.SWAP_IN_FLIGHT, target=None, epoch=snap.epoch, retry_after_s=0
            )
        )
    plan = make_plan(snap, policy, member, slots)
    if plan is not None and (check := read_first(snap, policy, slots, plan)) is not None:
        return check
    if plan is None:
        return Decision(
            reply=ErrorReply(
                code=ErrorCode.INCUMBENT_BUSY,
                message=f"{member} needs {policy.gib(member):g} GiB and only busy or pinned"
                " members could make room",
            )
        )
    start = start_plan(snap, policy, controller, plan, reason=SwapReason.ADMIN, forced=True)
    return start.decision(start.wait_reply(snap))


def decide_capacity_admin_unload(
    snap: PoolSnapshot, controller: str, policy: PoolPolicy, slots: SlotsRead = NOT_READ
) -> Decision:
    """An operator empties the pool: every resident is unloaded (pinned ones too), then it
    stays cold until demand; refused while any of them serves (live leases, or busy
    ``/slots`` under ``busySignal: leasesAndSlots``)."""
    busy = sorted(m for m in snap.residents if snap.serving(m))
    if busy:
        return Decision(
            reply=ErrorReply(
                code=ErrorCode.INCUMBENT_BUSY,
                message=f"{', '.join(busy)} may still serve (live leases)",
            )
        )
    plan = Plan(None, tuple(sorted(snap.residents)))
    if (check := read_first(snap, policy, slots, plan)) is not None:
        return check
    working = {m for m in snap.residents if busy_in_service(slots, m)}
    working |= {m for m in snap.evicts if at_work(slots, m)}
    if working:
        return Decision(
            reply=ErrorReply(
                code=ErrorCode.INCUMBENT_BUSY,
                message=f"{', '.join(sorted(working))}: /slots report requests in progress",
            )
        )
    start = start_plan(snap, policy, controller, plan, reason=SwapReason.ADMIN_UNLOAD)
    return start.decision(start.wait_reply(snap))


# --- the plan's end -----------------------------------------------------------------


def commit_ops(snap: PoolSnapshot) -> tuple[Op, ...]:
    """A plan's commit: its target joins the set (recorded as just used), unless it did
    already (its own commit, beside other loads: :func:`target_loaded_ops`; a target
    listed to unload was lost since, and stays counted). What is still listed to unload
    (a member lost during the plan, a member it failed to load) stays listed."""
    if snap.target is None or snap.target in snap.residents or snap.target in snap.evicts:
        return (set_state(also=()),)
    residents = snap.residents | {snap.target}
    return (set_state(residents=residents, also=()), mark_loaded(snap.target, snap.now_ms))


def target_loaded_ops(snap: PoolSnapshot, member: str) -> tuple[Op, ...]:
    """One of a plan's several targets is loaded: it joins the set at once (its waiters
    are granted while the others still load)."""
    return (set_state(residents=snap.residents | {member}), mark_loaded(member, snap.now_ms))


def evicts_left(snap: PoolSnapshot, unloaded: tuple[str, ...]) -> tuple[str, ...]:
    """The members still to confirm gone once ``unloaded`` were (a member lost while the
    plan ran was listed after the runner read its evicts)."""
    return tuple(m for m in snap.evicts if m not in unloaded)


def plan_failed_state(snap: PoolSnapshot) -> tuple[Op, ...]:
    """A failed plan: the set keeps its members; every member still listed to unload and
    its target (its load may have begun, its unload may have failed) stay counted until a
    later plan confirms them gone."""
    owed = list(snap.evicts)
    for member in unloaded_targets(snap):
        if member not in owed:
            owed.append(member)
    return (set_state(evicts=tuple(owed), also=()),)


def unloaded_targets(snap: PoolSnapshot) -> tuple[str, ...]:
    """The plan's targets that did not join the set (its target, then the others it
    loads beside it)."""
    targets = (snap.target, *snap.also) if snap.target else ()
    return tuple(m for m in targets if m not in snap.residents)


def pending_targets(snap: PoolSnapshot) -> tuple[str, ...]:
    """The plan's targets still to load: not in the set, nor failed (listed to unload)."""
    return tuple(m for m in unloaded_targets(snap) if m not in snap.evicts)


def decide_member_lost(
    snap: PoolSnapshot, member: str, reason: str, *, revoke: bool = False
) -> Decision:
    """A resident of a capacity pool is dead out of band: it leaves the set. Never while
    it serves, unless the driver confirmed it gone (``revoke``: its leases are dropped)."""
    if member not in snap.residents:
        return NOTHING
    if snap.serving(member) and not revoke:
        return NOTHING
    # Not proven gone, it may still hold its memory: it stays counted, and the next plan
    # unloads it (confirms it gone) before anything loads in its place.
    evicts = snap.evicts if revoke else (*snap.evicts, member)
    ops: tuple[Op, ...] = (
        set_state(
            residents=snap.residents - {member},
            evicts=evicts,
            unwell=snap.unwell - {member},
            closing=snap.closing - {member},
        ),
    )
    if revoke:
        ops = (*ops, RevokeLeases(member))
    return Decision(
        ops=ops,
        pre=Preconditions(version=snap.version, zero_leases=() if revoke else (member,)),
        audit=(
            AuditIntent(PoolOutcome.RESIDENT_LOST, member=member, epoch=snap.epoch, reason=reason),
        ),
    )


def decide_member_health(snap: PoolSnapshot, member: str, *, healthy: bool) -> Decision:
    """Mark (or clear) a resident of a capacity pool that fails its health checks while it
    serves: no new lease for it until it answers again or its last lease ends."""
    if member not in snap.residents or (member in snap.unwell) is not healthy:
        return NOTHING
    unwell = snap.unwell - {member} if healthy else snap.unwell | {member}
    return Decision(ops=(set_state(unwell=unwell),), pre=Preconditions(version=snap.version))
