"""Capacity pools as pure decisions (docs/adr/0008), no I/O: a residency set within a
memory budget, one plan in flight, evicting only idle members, cheapest first."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hotseat.status_cli import format_pools
from hotseat_common.config.model import BusySignal, PoolActivation
from hotseat_common.messages import (
    ErrorReply,
    Granted,
    IncumbentBusyReply,
    PoolOutcome,
    SwapReason,
    WaitReason,
    WaitReply,
)
from hotseat_pool_controller.decisions.acquire import decide_acquire
from hotseat_pool_controller.decisions.admin import decide_admin_swap
from hotseat_pool_controller.decisions.capacity import (
    closing_now,
    decide_member_lost,
    eviction_order,
    free_gib,
    make_plan,
)
from hotseat_pool_controller.decisions.schedule import closing_for
from hotseat_pool_controller.decisions.swap import (
    decide_begin_load,
    decide_commit,
    decide_fail,
    decide_target_loaded,
    decide_unloads_refused,
)
from hotseat_pool_controller.decisions.tick import decide_tick
from hotseat_pool_controller.model import (
    AcquireAsk,
    AddWaiter,
    ClearWaiters,
    Decision,
    Phase,
    PoolPolicy,
    PoolSnapshot,
    RecordDrainTime,
    SetState,
)
from hotseat_pool_controller.view import pool_view

NOW = 1_000_000
ME = "ctl-1"
POLICY = PoolPolicy(
    name="gpu0",
    members=("assistant", "embedder", "reranker", "coder"),
    max_waiters=10,
    lease_ttl_ms=15_000,
    swap_timeout_ms=600_000,
    failure_backoff_ms=5_000,
    busy_signal=BusySignal.LEASES,
    default=None,
    waiter_grace_ms=5_000,
    capacity_gib=24.0,
    memory_gib={"assistant": 6.0, "embedder": 4.0, "reranker": 4.0, "coder": 20.0},
)
WAIT = PoolActivation.WAIT
IF_IDLE = PoolActivation.IF_IDLE
LONG_AGO = NOW - 60_000


def snap(**fields: object) -> PoolSnapshot:
    base: dict[str, object] = {"now_ms": NOW, "phase": Phase.IDLE, "epoch": 7, "version": 3}
    base.update(fields)
    return PoolSnapshot(**base)  # type: ignore[arg-type]


def ask(member: str, mode: PoolActivation = WAIT, attempt: str = "r1") -> AcquireAsk:
    return AcquireAsk(member, mode, attempt, "client-1", "router-a", NOW + 300_000, "lease-new")


def state_of(decision: Decision) -> dict[str, str]:
    fields: dict[str, str] = {}
    for op in decision.ops:
        if isinstance(op, SetState):
            fields.update(op.fields)
    return fields


def test_a_resident_is_granted_while_a_plan_loads_another_member() -> None:
    """The set serves throughout a plan: no drain, no wait for the residents."""
    s = snap(
        phase=Phase.LOADING,
        residents=frozenset({"assistant", "embedder"}),
        target="reranker",
        owner="ctl-2",
    )
    d = decide_acquire(s, ask("embedder"), POLICY, ME)
    assert isinstance(d.reply, Granted)
    assert d.swap is None


@pytest.mark.parametrize("mode", [WAIT, IF_IDLE])
def test_a_member_that_fits_loads_without_evicting_anything(mode: PoolActivation) -> None:
    s = snap(residents=frozenset({"assistant", "embedder"}), leases={"assistant": 3})
    d = decide_acquire(s, ask("reranker", mode), POLICY, ME)
    assert isinstance(d.reply, WaitReply)
    assert d.swap is not None
    assert d.swap.evicts == ()
    fields = state_of(d)
    assert fields["phase"] == "unloading"
    assert fields["residents"] == "assistant,embedder"
    assert d.audit[0].reason == SwapReason.FITS
    assert any(isinstance(op, AddWaiter) for op in d.ops)


def test_only_enough_idle_members_are_evicted_cheapest_first() -> None:
    """coder (20 GiB) needs 20 of 24: the idle members go, cheapest reload first, then
    least recently used; a busy member is never evicted, and only as many as needed."""
    residents = frozenset({"embedder", "reranker"})
    s = snap(
        residents=residents,
        used={"embedder": NOW - 10_000, "reranker": NOW - 20_000},
        member_swap_times={"embedder": (0.9,), "reranker": (0.8,)},
    )
    # Within the same whole second of reload: least recently used first.
    assert eviction_order(s, POLICY) == ["reranker", "embedder"]
    plan = make_plan(s, POLICY, "coder")
    assert plan is not None
    assert plan.evicts == ("reranker",)  # 24 - 8 + 4 = 20: one is enough
    slow = replace(s, member_swap_times={"embedder": (1.0,), "reranker": (2.5,)})
    assert eviction_order(slow, POLICY) == ["embedder", "reranker"]  # cheaper reload first
    plan = make_plan(slow, POLICY, "coder")
    assert plan is not None
    assert plan.evicts == ("embedder",)


def test_a_copy_beyond_demand_is_evicted_before_a_cheaper_sole_copy() -> None:
    """docs/adr/0012: reranker is a copy beyond demand (its model group holds it resident
    on another pool too), embedder the only copy of its model. coder needs one of them
    gone: reranker goes, although embedder reloads faster and was used longer ago;
    without the other copy the order is ADR 0008's (embedder)."""
    s = snap(
        residents=frozenset({"embedder", "reranker"}),
        used={"embedder": NOW - 20_000, "reranker": NOW - 10_000},
        member_swap_times={"embedder": (0.5,), "reranker": (2.5,)},
    )
    assert eviction_order(s, POLICY) == ["embedder", "reranker"]
    plan = make_plan(s, POLICY, "coder")
    assert plan is not None
    assert plan.evicts == ("embedder",)
    beyond = replace(s, surplus=frozenset({"reranker"}))
    assert eviction_order(beyond, POLICY) == ["reranker", "embedder"]
    plan = make_plan(beyond, POLICY, "coder")
    assert plan is not None
    assert plan.evicts == ("reranker",)
    # Only idle members go, beyond demand or not: a busy surplus copy is kept.
    busy = replace(beyond, leases={"reranker": 1})
    plan = make_plan(busy, POLICY, "coder")
    assert plan is not None
    assert plan.evicts == ("embedder",)


def test_a_larger_member_spares_a_cheap_one_it_does_not_need() -> None:
    """Greedy order takes the cheap 4 GiB member first, then the 6 GiB one; the 6 GiB one
    alone was enough, so the cheap one stays."""
    s = snap(
        residents=frozenset({"assistant", "embedder", "reranker"}),
        member_swap_times={"embedder": (0.5,), "assistant": (2.0,), "reranker": (3.0,)},
        leases={"reranker": 1},
    )
    policy = replace(POLICY, memory_gib={**POLICY.memory_gib, "coder": 16.0})
    # Held 14, free 10; coder needs 16: 6 more. embedder (4) is not enough; assistant (6) is.
    plan = make_plan(s, policy, "coder")
    assert plan is not None
    assert plan.evicts == ("assistant",)


def test_busy_and_pinned_members_are_never_evicted() -> None:
    s = snap(residents=frozenset({"assistant", "embedder"}), leases={"assistant": 1})
    pinned = replace(POLICY, pinned=frozenset({"embedder"}))
    assert eviction_order(s, pinned) == []
    assert make_plan(s, pinned, "coder") is None


def test_when_only_busy_members_could_make_room_wait_holds_and_if_idle_skips() -> None:
    s = snap(residents=frozenset({"assistant", "embedder"}), leases={"assistant": 2})
    held = decide_acquire(s, ask("coder"), POLICY, ME)
    assert isinstance(held.reply, WaitReply)
    assert held.reply.reason == WaitReason.DRAINING
    assert held.swap is None
    assert state_of(held) == {"phase": "draining", "target": "coder", "cause": "client-1"}
    skipped = decide_acquire(s, ask("coder", IF_IDLE), POLICY, ME)
    assert isinstance(skipped.reply, IncumbentBusyReply)
    assert skipped.reply.resident == "assistant"
    assert not skipped.ops


def test_a_resident_with_a_waiter_just_loaded_for_it_is_not_evicted() -> None:
    """Its waiters are re-asking right after its load: it counts as busy; long after, a
    stray waiter of a dead router no longer pins it."""
    s = snap(residents=frozenset({"assistant"}), waiters={"assistant": 1}, used={"assistant": NOW})
    policy = replace(POLICY, memory_gib={**POLICY.memory_gib, "coder": 24.0})
    assert make_plan(s, policy, "coder") is None
    later = replace(s, used={"assistant": LONG_AGO})
    plan = make_plan(later, policy, "coder")
    assert plan is not None
    assert plan.evicts == ("assistant",)


def test_evicting_plan_guards_its_evicts_and_takes_them_out_of_the_set() -> None:
    s = snap(residents=frozenset({"assistant", "embedder", "reranker"}))
    d = decide_acquire(s, ask("coder"), POLICY, ME)
    assert d.swap is not None
    evicts = d.swap.evicts
    assert evicts is not None
    assert sum(POLICY.gib(m) for m in evicts) >= 6.0
    assert set(d.pre.zero_leases) == set(evicts)
    fields = state_of(d)
    assert set(fields["residents"].split(",")) == {"assistant", "embedder", "reranker"} - set(
        evicts
    )
    assert d.audit[0].reason == SwapReason.EVICT_IDLE
    assert d.audit[0].evicts == evicts


@pytest.mark.parametrize("mode", [WAIT, IF_IDLE])
def test_a_member_being_loaded_or_evicted_waits_in_both_modes(mode: PoolActivation) -> None:
    s = snap(
        phase=Phase.UNLOADING,
        residents=frozenset({"assistant"}),
        evicts=("embedder",),
        target="coder",
        owner="ctl-2",
    )
    for member in ("coder", "embedder"):
        d = decide_acquire(s, ask(member, mode), POLICY, ME)
        assert isinstance(d.reply, WaitReply), (member, d.reply)
        assert d.swap is None


def test_if_idle_for_a_member_that_will_not_fit_after_the_plan_is_skipped() -> None:
    s = snap(phase=Phase.LOADING, residents=frozenset({"assistant"}), target="coder", owner="x")
    d = decide_acquire(s, ask("embedder", IF_IDLE), POLICY, ME)
    assert isinstance(d.reply, IncumbentBusyReply)
    roomy = replace(s, target="reranker")
    d = decide_acquire(roomy, ask("embedder", IF_IDLE), POLICY, ME)
    assert isinstance(d.reply, WaitReply)


def test_commit_adds_the_target_to_the_set_and_begin_load_forgets_the_evicts() -> None:
    s = snap(
        phase=Phase.UNLOADING,
        residents=frozenset({"assistant"}),
        evicts=("embedder",),
        target="coder",
        owner=ME,
        waiters={"coder": 1},
    )
    begin = decide_begin_load(s, 7, ME, POLICY, ("embedder",))
    assert begin is not None
    assert state_of(begin) == {"phase": "loading", "evicts": "", "loading": str(NOW)}
    loading = replace(s, phase=Phase.LOADING, evicts=())
    commit = decide_commit(loading, 7, ME, POLICY)
    assert commit is not None
    fields = state_of(commit)
    assert fields["residents"] == "assistant,coder"
    assert fields["phase"] == "idle"
    assert fields["used.coder"] == str(NOW)
    assert commit.audit[0].outcome == PoolOutcome.SWAP_COMPLETED


def test_a_failed_plan_keeps_the_set_and_counts_what_it_could_not_confirm_gone() -> None:
    s = snap(
        phase=Phase.UNLOADING,
        residents=frozenset({"assistant"}),
        evicts=("embedder",),
        target="coder",
        owner=ME,
    )
    d = decide_fail(s, POLICY, 7, ME, "boom")
    assert d is not None
    fields = state_of(d)
    assert "residents" not in fields
    assert fields["evicts"] == "embedder,coder"
    after = replace(s, phase=Phase.IDLE, target=None, owner=None, evicts=("embedder", "coder"))
    assert free_gib(after, POLICY) == 24.0 - 6.0 - 4.0 - 20.0  # all of them may hold memory
    tick = decide_tick(after, POLICY, ME)
    assert tick.swap is not None
    assert set(tick.swap.evicts or ()) == {"embedder", "coder"}
    assert tick.swap.target == ""


def test_a_lost_resident_not_proven_gone_stays_counted_until_unloaded() -> None:
    s = snap(residents=frozenset({"assistant", "embedder"}))
    d = decide_member_lost(s, "embedder", "health check failed")
    fields = state_of(d)
    assert fields["residents"] == "assistant"
    assert fields["evicts"] == "embedder"
    busy = replace(s, leases={"embedder": 1})
    assert not decide_member_lost(busy, "embedder", "health check failed").ops


def test_the_tick_warms_pinned_members_and_plans_for_the_most_urgent_absent_member() -> None:
    pinned = replace(POLICY, pinned=frozenset({"embedder"}))
    cold = decide_tick(snap(), pinned, ME)
    assert cold.swap is not None
    assert cold.swap.target == "embedder"
    assert cold.audit[0].reason == SwapReason.WARM_DEFAULT
    waiting = snap(
        residents=frozenset({"embedder"}),
        waiters={"coder": 1, "reranker": 1},
        urgency={"coder": NOW - 5, "reranker": NOW - 1},
    )
    d = decide_tick(waiting, pinned, ME)
    assert d.swap is not None
    assert d.swap.target == "coder"
    assert d.swap.evicts == ()


def test_admin_swap_refuses_when_only_busy_members_could_make_room() -> None:
    s = snap(residents=frozenset({"assistant", "embedder"}), leases={"embedder": 1, "assistant": 1})
    d = decide_admin_swap(s, "coder", ME, POLICY)
    assert isinstance(d.reply, ErrorReply)
    assert d.reply.code == "incumbent_busy"


SLOTS = replace(POLICY, busy_signal=BusySignal.LEASES_AND_SLOTS)


def test_under_leases_and_slots_a_plan_reads_each_member_it_evicts_first() -> None:
    """Under leasesAndSlots the members a plan would evict have their /slots read before
    it starts: one read busy (traffic that bypassed the router, no lease) is not evicted
    and the next idle one goes in its place; none left: Wait drains, IfIdle is skipped."""
    s = snap(
        residents=frozenset({"embedder", "reranker"}),
        used={"embedder": NOW - 10_000, "reranker": NOW - 20_000},
    )
    need = decide_acquire(s, ask("coder"), SLOTS, ME)
    assert need.need_idle_check == ("reranker",)
    assert need.ops == ()
    assert need.swap is None
    idle = decide_acquire(s, ask("coder"), SLOTS, ME, slots_busy={"reranker": False})
    assert idle.swap is not None
    assert idle.swap.evicts == ("reranker",)
    busy = {"reranker": True}
    need = decide_acquire(s, ask("coder"), SLOTS, ME, slots_busy=busy)
    assert need.need_idle_check == ("embedder",)
    other = decide_acquire(s, ask("coder"), SLOTS, ME, slots_busy={**busy, "embedder": False})
    assert other.swap is not None
    assert other.swap.evicts == ("embedder",)
    for unanswered in (True, None):  # a read that does not answer counts as busy
        every = {"reranker": True, "embedder": unanswered}
        held = decide_acquire(s, ask("coder"), SLOTS, ME, slots_busy=every)
        assert isinstance(held.reply, WaitReply)
        assert held.reply.reason == WaitReason.DRAINING
        assert held.swap is None
        skipped = decide_acquire(s, ask("coder", IF_IDLE), SLOTS, ME, slots_busy=every)
        assert isinstance(skipped.reply, IncumbentBusyReply)
    # Leases only: no read, the plan starts at once.
    assert decide_acquire(s, ask("coder"), POLICY, ME).swap is not None


def test_under_leases_and_slots_a_member_left_to_unload_is_read_before_any_plan() -> None:
    """A member a failed plan left loaded is unloaded by the next plan: its /slots are
    read first; at work, no plan starts (Wait holds); not answering (it failed already),
    it is unloaded."""
    s = snap(residents=frozenset({"assistant"}), evicts=("embedder",))
    need = decide_acquire(s, ask("reranker"), SLOTS, ME)
    assert need.need_idle_check == ("embedder",)
    held = decide_acquire(s, ask("reranker"), SLOTS, ME, slots_busy={"embedder": True})
    assert isinstance(held.reply, WaitReply)
    assert held.swap is None
    for read in (False, None):
        go = decide_acquire(s, ask("reranker"), SLOTS, ME, slots_busy={"embedder": read})
        assert go.swap is not None
        assert go.swap.evicts == ("embedder",)
    tick = decide_tick(replace(s, residents=frozenset()), SLOTS, ME)
    assert tick.need_idle_check == ("embedder",)
    later = decide_tick(replace(s, residents=frozenset()), SLOTS, ME, slots_busy={"embedder": True})
    assert later.swap is None


def test_the_swap_ends_unloading_nothing_when_its_own_read_finds_a_member_at_work() -> None:
    """The runner reads /slots right before its unloads: a member at work is not
    unloaded; the plan ends (cancelled), its evicts stay counted and its target's waiters
    keep waiting while the pool drains toward it."""
    s = snap(
        phase=Phase.UNLOADING,
        residents=frozenset({"assistant"}),
        evicts=("embedder", "reranker"),
        target="coder",
        owner=ME,
        waiters={"coder": 1},
    )
    d = decide_unloads_refused(s, SLOTS, 7, ME, ("reranker",))
    assert d is not None
    fields = state_of(d)
    assert fields["phase"] == "draining"
    assert fields["target"] == "coder"
    assert fields["evicts"] == "embedder,reranker"
    assert d.audit[0].outcome == PoolOutcome.SWAP_CANCELLED
    assert decide_unloads_refused(s, SLOTS, 7, "ctl-2", ("reranker",)) is None  # not ours


# --- maxWait: closing the residents a waiter's plan needs (docs/adr/0008) --------------

MAX_WAIT = replace(POLICY, max_wait_ms=5_000, min_residency_ms=2_000)
CLOSED_NOW = {"closing": "assistant", "closedat": str(NOW)}
"""assistant closed now, the pool's first close (its moment kept to measure the drain)."""


def waiting_for_coder(waited_ms: int, **fields: object) -> PoolSnapshot:
    """coder (20 GiB) waits, the pool draining toward it; assistant (6 GiB) serves."""
    base: dict[str, object] = {
        "phase": Phase.DRAINING,
        "target": "coder",
        "residents": frozenset({"assistant", "embedder"}),
        "leases": {"assistant": 1},
        "waiters": {"coder": 1},
        "urgency": {"coder": NOW - waited_ms},
        "loaded": {"assistant": LONG_AGO, "embedder": LONG_AGO},
    }
    base.update(fields)
    return snap(**base)


def test_max_wait_closes_the_busy_resident_the_waiters_plan_needs() -> None:
    """Before maxWait nothing closes (sticky residency); at maxWait the tick closes the
    cheapest set that makes room, the busy assistant included: the idle embedder alone
    frees too little, and only enough members are closed."""
    assert decide_tick(waiting_for_coder(4_999), MAX_WAIT, ME).ops == ()
    assert decide_tick(waiting_for_coder(60_000), POLICY, ME).ops == ()  # no maxWait
    d = decide_tick(waiting_for_coder(5_000), MAX_WAIT, ME)
    assert state_of(d) == CLOSED_NOW
    assert d.pre.version == 3
    assert d.swap is None


def test_the_waiter_closes_them_when_it_is_the_first_to_see_the_time_has_come() -> None:
    d = decide_acquire(waiting_for_coder(6_000, attempt_waiting=True), ask("coder"), MAX_WAIT, ME)
    assert isinstance(d.reply, WaitReply)
    assert d.reply.reason == WaitReason.DRAINING
    assert state_of(d) == CLOSED_NOW


def test_a_resident_within_its_min_residency_is_not_closed() -> None:
    """A waiter that came after the resident's commit waits for its minResidency (60 s
    here, longer than maxWait: the operator's choice of dwell over bound)."""
    dwell = replace(MAX_WAIT, min_residency_ms=60_000)
    young = waiting_for_coder(6_000, loaded={"assistant": NOW - 10_000, "embedder": LONG_AGO})
    assert decide_tick(young, dwell, ME).ops == ()
    grown = replace(young, loaded={"assistant": NOW - 60_000, "embedder": LONG_AGO})
    assert state_of(decide_tick(grown, dwell, ME)) == CLOSED_NOW


def test_a_waiter_in_line_before_the_residents_commit_is_not_held_by_min_residency() -> None:
    """minResidency keeps a resident from the demand that came after its commit, not from
    a waiter already in line (docs/adr/0006, as in a one-resident pool): that waiter is
    bounded by maxWait alone, and the young resident closes for it."""
    dwell = replace(MAX_WAIT, min_residency_ms=60_000)
    loaded = {"assistant": NOW - 1_000, "embedder": LONG_AGO}
    before = waiting_for_coder(6_000, loaded=loaded)
    assert state_of(decide_tick(before, dwell, ME)) == CLOSED_NOW
    d = decide_acquire(replace(before, attempt_waiting=True), ask("coder"), dwell, ME)
    assert state_of(d) == CLOSED_NOW
    # Its priority ranks a waiter that came later as in line before the commit too.
    urgent = waiting_for_coder(500, loaded=loaded, urgency={"coder": NOW - 500 - 10_000})
    assert state_of(decide_tick(urgent, dwell, ME)) == CLOSED_NOW


def test_a_new_resident_serves_its_own_waiters_first_unless_the_waiter_ranks_ahead() -> None:
    """A resident just loaded whose own waiters are re-asking (the waiter grace) is not
    closed for a waiter that came after them; one that ranks ahead of them (in line
    first, or of a higher priority) closes it at once."""
    loaded = {"assistant": NOW - 1_000, "embedder": LONG_AGO}
    own = {"coder": 1, "assistant": 1}
    behind = waiting_for_coder(
        6_000, loaded=loaded, waiters=own, urgency={"coder": NOW - 6_000, "assistant": NOW - 8_000}
    )
    assert decide_tick(behind, MAX_WAIT, ME).ops == ()
    ahead = replace(behind, urgency={"coder": NOW - 6_000, "assistant": NOW - 3_000})
    assert state_of(decide_tick(ahead, MAX_WAIT, ME)) == CLOSED_NOW


def test_a_busy_resident_closes_earlier_by_its_measured_drain() -> None:
    """The close comes once the waiter's wait plus the expected drain of the members it
    closes (the longest of their measured drains and request times) reaches maxWait, as
    in a one-resident pool; another resident's drain, not closed, does not count."""
    assert decide_tick(waiting_for_coder(3_000), MAX_WAIT, ME).ops == ()
    slow = waiting_for_coder(3_000, member_request_times={"assistant": (2.5, 0.5)})
    assert state_of(decide_tick(slow, MAX_WAIT, ME)) == CLOSED_NOW
    drained = waiting_for_coder(3_000, member_drain_times={"assistant": (2.0,)})
    assert state_of(decide_tick(drained, MAX_WAIT, ME)) == CLOSED_NOW
    short = waiting_for_coder(3_000, member_request_times={"assistant": (1.9,)})
    assert decide_tick(short, MAX_WAIT, ME).ops == ()
    # embedder (idle, 4 GiB) frees too little alone and is spared: its drain is not waited for.
    other = waiting_for_coder(3_000, member_request_times={"embedder": (4.0,)})
    assert decide_tick(other, MAX_WAIT, ME).ops == ()
    # No maxWait: no estimate closes anything.
    assert decide_tick(slow, POLICY, ME).ops == ()


def _committing_assistant(urgency: dict[str, int]) -> PoolSnapshot:
    """A plan loads assistant beside the idle embedder; assistant's own request and a
    coder request (20 GiB: it needs assistant's memory) wait."""
    return snap(
        phase=Phase.LOADING,
        target="assistant",
        owner=ME,
        residents=frozenset({"embedder"}),
        loaded={"embedder": LONG_AGO},
        used={"embedder": LONG_AGO},
        waiters={"assistant": 1, "coder": 1},
        urgency=urgency,
    )


def test_a_plan_commit_closes_its_target_for_a_waiter_that_ranks_ahead_of_its_own() -> None:
    """A coder request of higher priority that came during assistant's load ranks ahead
    of the request assistant was loaded for: the commit itself closes assistant (not one
    of its requests is granted first) and the pool drains toward coder. A coder waiter
    that ranks behind assistant's own leaves the commit open."""
    ahead = _committing_assistant({"assistant": NOW - 3_000, "coder": NOW - 1_000 - 10_000})
    d = decide_commit(ahead, 7, ME, MAX_WAIT)
    assert d is not None
    fields = state_of(d)
    assert (fields["phase"], fields["target"], fields["closing"]) == (
        "draining",
        "coder",
        "assistant",
    )
    assert fields["residents"] == "assistant,embedder"
    behind = _committing_assistant({"assistant": NOW - 8_000, "coder": NOW - 6_000})
    opened = decide_commit(behind, 7, ME, MAX_WAIT)
    assert opened is not None
    assert state_of(opened)["phase"] == "idle"
    assert "closing" not in state_of(opened)
    unbounded = decide_commit(ahead, 7, ME, POLICY)  # no maxWait: nothing closes
    assert unbounded is not None
    assert "closing" not in state_of(unbounded)


def test_pinned_and_default_members_are_never_closed() -> None:
    pinned = replace(MAX_WAIT, pinned=frozenset({"assistant"}))
    assert decide_tick(waiting_for_coder(60_000), pinned, ME).ops == ()
    default = replace(MAX_WAIT, default="assistant")
    assert decide_tick(waiting_for_coder(60_000), default, ME).ops == ()


@pytest.mark.parametrize("mode", [WAIT, IF_IDLE])
def test_a_closed_resident_takes_no_new_lease(mode: PoolActivation) -> None:
    s = waiting_for_coder(6_000, closing=frozenset({"assistant"}))
    d = decide_acquire(s, ask("assistant", mode), MAX_WAIT, ME)
    if mode == WAIT:
        assert isinstance(d.reply, WaitReply)
        assert d.reply.reason == WaitReason.CLOSED
        assert any(isinstance(op, AddWaiter) for op in d.ops)
    else:
        assert isinstance(d.reply, IncumbentBusyReply)
    # The other residents are granted as before.
    assert isinstance(decide_acquire(s, ask("embedder", mode), MAX_WAIT, ME).reply, Granted)


def test_once_the_closed_resident_drained_the_plan_evicts_it_and_reopens_the_rest() -> None:
    """Its own held waiters do not keep it (they wait for its swap back); the plan starts
    with the closed set cleared."""
    s = waiting_for_coder(
        9_000,
        leases={},
        waiters={"coder": 1, "assistant": 2},
        used={"assistant": NOW},
        closing=frozenset({"assistant"}),
        closed_ms=NOW - 3_000,
    )
    d = decide_tick(s, MAX_WAIT, ME)
    assert d.swap is not None
    assert d.swap.target == "coder"
    assert d.swap.evicts == ("assistant",)
    assert state_of(d)["closing"] == ""
    assert set(d.pre.zero_leases) == {"assistant"}
    # Its drain, from the close to its last lease's release, is measured with the start,
    # once (the same write clears the close's moment).
    assert [op for op in d.ops if isinstance(op, RecordDrainTime)] == [
        RecordDrainTime("assistant", 3.0)
    ]
    assert state_of(d)["closedat"] == ""
    # A member idle at the close (its last release before it) drained at once: nothing.
    idle = replace(s, used={"assistant": NOW - 4_000})
    assert not [op for op in decide_tick(idle, MAX_WAIT, ME).ops if isinstance(op, RecordDrainTime)]


def test_the_closed_set_opens_when_the_drain_retargets_or_ends() -> None:
    closed = waiting_for_coder(9_000, closing=frozenset({"assistant"}))
    gone = decide_tick(replace(closed, waiters={}), MAX_WAIT, ME)
    assert state_of(gone)["closing"] == ""
    assert state_of(gone)["phase"] == "idle"
    other = replace(
        closed,
        residents=frozenset({"embedder", "coder"}),
        leases={},
        waiters={"assistant": 1, "reranker": 1},
        urgency={"assistant": NOW - 1_000, "reranker": NOW - 20_000},
        target="assistant",
    )
    retargeted = decide_tick(other, MAX_WAIT, ME)
    assert state_of(retargeted)["target"] == "reranker"
    assert state_of(retargeted)["closing"] == ""


def test_a_more_urgent_waiter_reaches_max_wait_sooner() -> None:
    """Priority moves a waiter's virtual arrival earlier (docs/adr/0006): it counts as
    having waited maxWait sooner, as in a one-resident pool."""
    urgent = waiting_for_coder(1_000, urgency={"coder": NOW - 1_000 - 10_000})
    assert state_of(decide_tick(urgent, MAX_WAIT, ME)) == CLOSED_NOW


@given(
    waited=st.integers(0, 20_000),
    age=st.integers(0, 20_000),
    own=st.one_of(st.none(), st.integers(0, 30_000)),
    drain=st.one_of(st.none(), st.floats(0, 10, allow_nan=False)),
    dwell=st.integers(0, 20_000),
)
def test_a_busy_resident_closes_exactly_when_a_one_resident_pool_would_close_it(
    waited: int, age: int, own: int | None, drain: float | None, dwell: int
) -> None:
    """One judgement for both pools (docs/adr/0006, 0008): a busy member whose memory a
    waiter needs is closed for it exactly when a one-resident pool would close its busy
    resident for the same waiter: the same wait and expected drain against maxWait, the
    same dwell (from its commit) and the same exceptions (a waiter in line before the
    commit; the requests it was loaded for first, unless the waiter ranks ahead).
    ``own``: how long ago the resident's own most urgent waiter arrived (None: none)."""
    policy = replace(MAX_WAIT, min_residency_ms=dwell)
    waiters = {"coder": 1} | ({"assistant": 1} if own is not None else {})
    urgency = {"coder": NOW - waited} | ({"assistant": NOW - own} if own is not None else {})
    times = {"assistant": (drain,)} if drain is not None else {}
    common: dict[str, object] = {
        "leases": {"assistant": 1},
        "waiters": waiters,
        "urgency": urgency,
        "member_request_times": times,
    }
    one = snap(resident="assistant", committed_ms=NOW - age, **common)
    # assistant (6 GiB) alone: coder (20 GiB) fits only once it is gone.
    capacity = snap(
        residents=frozenset({"assistant"}),
        loaded={"assistant": NOW - age},
        used={"assistant": NOW - age},
        phase=Phase.DRAINING,
        target="coder",
        **common,
    )
    one_closes = closing_for(one, policy) == "coder"
    assert (closing_now(capacity, policy, "coder") == {"assistant"}) is one_closes


# --- demand in the eviction order (docs/adr/0008) ---------------------------------------

DEMAND = replace(POLICY, demand_half_life_ms=600_000)


def test_of_two_members_of_the_same_reload_cost_the_one_asked_for_least_lately_goes() -> None:
    """embedder served 8 requests, reranker 1 since; reranker is the more recently used
    but the less asked for: it goes first (least recently used alone would take
    embedder). Demand halves every half-life: 40 minutes later embedder's 8 count as
    half a request, and recency decides again. Cost still comes first."""
    s = snap(
        residents=frozenset({"embedder", "reranker"}),
        used={"embedder": NOW - 20_000, "reranker": NOW - 10_000},
        member_swap_times={"embedder": (0.6,), "reranker": (0.7,)},
        demand={"embedder": (8.0, NOW - 20_000), "reranker": (1.0, NOW - 10_000)},
    )
    assert eviction_order(s, POLICY) == ["embedder", "reranker"]  # not counted: recency
    assert eviction_order(s, DEMAND) == ["reranker", "embedder"]
    plan = make_plan(s, DEMAND, "coder")
    assert plan is not None
    assert plan.evicts == ("reranker",)
    stale = replace(s, demand={"embedder": (8.0, NOW - 2_400_000), "reranker": (1.0, NOW)})
    assert eviction_order(stale, DEMAND) == ["embedder", "reranker"]
    costly = replace(s, member_swap_times={"embedder": (0.6,), "reranker": (2.5,)})
    assert eviction_order(costly, DEMAND) == ["embedder", "reranker"]  # cheaper reload first


def test_demand_never_makes_a_busy_or_pinned_member_evictable_nor_takes_more() -> None:
    """The demand only orders the idle, unpinned candidates; the plan still takes only
    as many as needed."""
    s = snap(
        residents=frozenset({"assistant", "embedder", "reranker"}),
        leases={"assistant": 1},
        demand={"embedder": (50.0, NOW), "reranker": (0.0, NOW), "assistant": (0.0, NOW)},
    )
    pinned = replace(DEMAND, pinned=frozenset({"reranker"}))
    assert eviction_order(s, pinned) == ["embedder"]
    plan = make_plan(s, DEMAND, "coder")
    assert plan is None  # 24 - 14 + 8 = 18 < 20 without the busy assistant
    fits = replace(DEMAND, memory_gib={**DEMAND.memory_gib, "coder": 14.0})
    plan = make_plan(s, fits, "coder")
    assert plan is not None
    assert plan.evicts == ("reranker",)  # one is enough: the one asked for least


def test_a_plan_loads_the_other_waited_members_that_fit_beside_it() -> None:
    """assistant (6) resident; embedder, reranker and coder wait, embedder the most urgent:
    the plan for embedder loads reranker beside it (6 + 4 + 4 GiB), not coder (20 GiB,
    which would need assistant gone: the plan evicts nothing more for the others); the
    pool view and ``hotseat status`` name both loads."""
    waiting = snap(
        residents=frozenset({"assistant"}),
        waiters={"embedder": 1, "reranker": 1, "coder": 1},
        urgency={"embedder": NOW - 3_000, "coder": NOW - 2_000, "reranker": NOW - 1_000},
    )
    plan = make_plan(waiting, POLICY, "embedder")
    assert plan is not None
    assert (plan.target, plan.evicts, plan.also) == ("embedder", (), ("reranker",))
    decision = decide_tick(waiting, POLICY, ME)
    assert state_of(decision)["also"] == "reranker"
    assert decision.swap is not None
    assert decision.audit[0].also == ("reranker",)
    loading = replace(
        waiting, phase=Phase.LOADING, target="embedder", also=("reranker",), started_ms=NOW
    )
    assert free_gib(loading, POLICY) == 24 - 6 - 4 - 4
    view = pool_view(POLICY, loading)
    assert (view.loading, view.loading_also) == ("embedder", ["reranker"])
    assert "embedder,reranker (loading" in format_pools([view])
    # reranker's own commit: it joins the set while embedder still loads.
    joined = decide_target_loaded(loading, loading.epoch, loading.owner or "", "reranker")
    assert joined is None  # not this controller's plan
    mine = replace(loading, owner=ME)
    joined = decide_target_loaded(mine, mine.epoch, ME, "reranker")
    assert joined is not None
    assert state_of(joined)["residents"] == "assistant,reranker"
    assert joined.pre.version == mine.version
    after = replace(mine, residents=frozenset({"assistant", "reranker"}))
    assert pool_view(POLICY, after).loading_also == []
    ended = decide_commit(after, after.epoch, ME, POLICY)
    assert ended is not None
    assert state_of(ended)["residents"] == "assistant,embedder,reranker"
    assert state_of(ended)["also"] == ""


def test_a_failed_plan_of_several_keeps_counting_every_member_not_loaded() -> None:
    """The plan for embedder and reranker times out after reranker joined the set:
    embedder stays counted (listed to unload), reranker stays a resident, and embedder's
    waiters are told."""
    loading = snap(
        phase=Phase.LOADING,
        owner=ME,
        target="embedder",
        also=("reranker",),
        residents=frozenset({"assistant", "reranker"}),
        waiters={"embedder": 1},
    )
    failed = decide_fail(loading, POLICY, loading.epoch, ME, "swap_timeout")
    assert failed is not None
    fields = state_of(failed)
    assert fields["evicts"] == "embedder"
    assert fields["also"] == ""
    assert "residents" not in fields
    assert [op.member for op in failed.ops if isinstance(op, ClearWaiters)] == ["embedder"]
