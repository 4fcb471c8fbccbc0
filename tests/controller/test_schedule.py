"""The scheduler as pure decisions (docs/adr/0006): urgency with priorities and aging,
``maxWait`` closing a busy resident after ``minResidency``, swap backs, admission from an
honest estimate, idle unload and return to the default. No I/O."""

from __future__ import annotations

from dataclasses import replace

from hotseat_common.config.model import BusySignal, PoolActivation
from hotseat_common.errors import ErrorCode
from hotseat_common.messages import (
    ErrorReply,
    Granted,
    IncumbentBusyReply,
    PoolOutcome,
    RetargetReason,
    SwapReason,
    WaitReason,
    WaitReply,
)
from hotseat_pool_controller.decisions.acquire import decide_acquire
from hotseat_pool_controller.decisions.busy import NOT_READ, incumbent_busy
from hotseat_pool_controller.decisions.schedule import eta_s, min_residency_ms, ranked
from hotseat_pool_controller.decisions.swap import decide_begin_load, decide_commit, retargeted_to
from hotseat_pool_controller.decisions.tick import decide_tick
from hotseat_pool_controller.model import (
    NOTHING,
    AcquireAsk,
    AddWaiter,
    ClearWaiters,
    Decision,
    Phase,
    PoolPolicy,
    PoolSnapshot,
    RecordDrainTime,
    RecordSwapTime,
    SetState,
)
from hotseat_pool_controller.view import pool_view

NOW = 10_000_000
ME = "ctl-1"
POLICY = PoolPolicy(
    name="gpu0",
    members=("chat", "coder", "embed"),
    max_waiters=100,
    lease_ttl_ms=15_000,
    swap_timeout_ms=600_000,
    failure_backoff_ms=5_000,
    busy_signal=BusySignal.LEASES,
    default=None,
)
FAIR = replace(POLICY, max_wait_ms=5_000, min_residency_ms=2_000)
WAIT = PoolActivation.WAIT
IF_IDLE = PoolActivation.IF_IDLE


def snap(**fields: object) -> PoolSnapshot:
    base: dict[str, object] = {"now_ms": NOW, "phase": Phase.IDLE, "epoch": 7, "version": 3}
    base.update(fields)
    return PoolSnapshot(**base)  # type: ignore[arg-type]


def ask(
    member: str,
    mode: PoolActivation = WAIT,
    *,
    priority: int = 0,
    hold_ms: int = 300_000,
    attempt: str = "r1",
) -> AcquireAsk:
    return AcquireAsk(
        member,
        mode,
        attempt,
        "client-1",
        "router-a",
        NOW + hold_ms,
        "lease-new",
        priority=priority,
        now_ms=NOW,
    )


def state_of(decision: Decision) -> dict[str, str]:
    fields: dict[str, str] = {}
    for op in decision.ops:
        if isinstance(op, SetState):
            fields.update(op.fields)
    return fields


# --- who goes next -------------------------------------------------------------------


def test_a_priority_moves_a_waiter_earlier_by_the_aging_step_per_level() -> None:
    """A held request of priority 2 is written with a virtual arrival 2 aging steps
    before now; priority 0 with now."""
    busy = snap(resident="chat", leases={"chat": 1})
    for priority, expected in ((0, NOW), (2, NOW - 2 * POLICY.priority_aging_ms)):
        d = decide_acquire(busy, ask("coder", priority=priority), POLICY, ME)
        (waiter,) = [op for op in d.ops if isinstance(op, AddWaiter)]
        assert waiter.urgency_ms == expected


def test_the_most_urgent_member_goes_next_not_the_most_numerous() -> None:
    """Three waiters for coder that came late lose to one for embed that came first."""
    s = snap(
        resident="chat",
        waiters={"coder": 3, "embed": 1},
        urgency={"coder": NOW - 1_000, "embed": NOW - 8_000},
    )
    assert ranked(s) == ["embed", "coder"]
    d = decide_tick(s, POLICY, ME)
    assert d.swap is not None
    assert d.swap.target == "embed"


def test_aging_lets_a_low_priority_waiter_overtake_a_later_high_priority_one() -> None:
    """Priority 1 counts one aging step: a priority 0 waiter that waited longer than one
    step more ranks first."""
    step = POLICY.priority_aging_ms
    s = snap(
        resident="chat",
        waiters={"coder": 1, "embed": 1},
        urgency={"coder": NOW - 2 * step, "embed": NOW - 1_000 - step},  # embed: p1, 1 s ago
    )
    assert ranked(s)[0] == "coder"
    s = replace(s, urgency={"coder": NOW - step // 2, "embed": NOW - 1_000 - step})
    assert ranked(s)[0] == "embed"


def test_a_drain_turns_toward_a_more_urgent_member() -> None:
    """Draining toward coder, a more urgent waiter for embed arrives: the drain retargets."""
    s = snap(
        phase=Phase.DRAINING,
        resident="chat",
        target="coder",
        leases={"chat": 1},
        waiters={"coder": 1, "embed": 1},
        urgency={"coder": NOW - 1_000, "embed": NOW - 30_000},
    )
    d = decide_tick(s, POLICY, ME)
    assert state_of(d) == {"target": "embed"}
    assert d.swap is None


# --- maxWait and minResidency ------------------------------------------------------------


def busy_resident(waited_ms: int, resident_for_ms: int, **fields: object) -> PoolSnapshot:
    base: dict[str, object] = {
        "phase": Phase.DRAINING,
        "resident": "chat",
        "target": "coder",
        "committed_ms": NOW - resident_for_ms,
        "leases": {"chat": 2},
        "waiters": {"coder": 1},
        "urgency": {"coder": NOW - waited_ms},
    }
    base.update(fields)
    return snap(**base)


def test_without_max_wait_the_busy_resident_keeps_the_gpu() -> None:
    """Sticky residency by default: however long coder waited, chat's requests are
    granted and the tick only keeps draining."""
    s = busy_resident(waited_ms=600_000, resident_for_ms=600_000)
    assert isinstance(decide_acquire(s, ask("chat"), POLICY, ME).reply, Granted)
    assert decide_tick(s, POLICY, ME).ops == ()


def test_max_wait_closes_the_resident_once_the_waiter_waited_that_long() -> None:
    """Before maxWait nothing closes; at maxWait the tick closes chat (it drains, no new
    lease), and a request for chat is then held for the swap back."""
    early = busy_resident(waited_ms=4_999, resident_for_ms=60_000)
    assert state_of(decide_tick(early, FAIR, ME)) == {}
    assert isinstance(decide_acquire(early, ask("chat"), FAIR, ME).reply, Granted)
    due = busy_resident(waited_ms=5_000, resident_for_ms=60_000)
    d = decide_tick(due, FAIR, ME)
    assert state_of(d)["closed"] == "1"
    assert d.swap is None  # chat still serves: nothing is cut
    closed = replace(due, closed=True)
    held = decide_acquire(closed, ask("chat"), FAIR, ME)
    assert isinstance(held.reply, WaitReply)
    assert held.reply.reason == WaitReason.CLOSED
    assert [op.member for op in held.ops if isinstance(op, AddWaiter)] == ["chat"]


def test_the_first_request_to_see_max_wait_closes_the_resident_itself() -> None:
    """A request for the resident that arrives when maxWait has passed (before any tick)
    is held, and its decision closes the resident."""
    due = busy_resident(waited_ms=7_000, resident_for_ms=60_000)
    d = decide_acquire(due, ask("chat"), FAIR, ME)
    assert isinstance(d.reply, WaitReply)
    assert state_of(d) == {
        "phase": "draining",
        "target": "coder",
        "closed": "1",
        "closedat": str(NOW),
    }


def test_if_idle_requests_for_a_closed_resident_are_skipped() -> None:
    """IfIdle never waits for a swap out and back: incumbent busy at once."""
    closed = busy_resident(waited_ms=7_000, resident_for_ms=60_000, closed=True)
    d = decide_acquire(closed, ask("chat", IF_IDLE), FAIR, ME)
    assert isinstance(d.reply, IncumbentBusyReply)
    assert not any(isinstance(op, AddWaiter) for op in d.ops)


def test_min_residency_protects_a_new_resident() -> None:
    """A resident younger than minResidency is not closed for a waiter that came after it,
    however long past maxWait that waiter waited (minResidency 60 s, maxWait 5 s)."""
    dwell = replace(FAIR, min_residency_ms=60_000)
    young = busy_resident(waited_ms=59_000, resident_for_ms=59_999)
    assert "closed" not in state_of(decide_tick(young, dwell, ME))
    assert isinstance(decide_acquire(young, ask("chat"), dwell, ME).reply, Granted)
    old_enough = busy_resident(waited_ms=59_000, resident_for_ms=60_000)
    assert state_of(decide_tick(old_enough, dwell, ME))["closed"] == "1"


def test_a_waiter_in_line_before_the_commit_is_not_held_by_min_residency() -> None:
    """coder's waiter arrived during the swap that made chat resident (it waited longer
    than chat has been resident): once its wait plus chat's expected drain reaches
    maxWait, chat closes although it is younger than minResidency (the waiter's deadline
    wins over the dwell). Before that point nothing closes; a waiter that came a moment
    after the commit is still held by the dwell."""
    drains = {"chat": (2.0,)}
    before = busy_resident(waited_ms=2_999, resident_for_ms=500, member_drain_times=drains)
    assert state_of(decide_tick(before, FAIR, ME)) == {}
    due = busy_resident(waited_ms=3_000, resident_for_ms=500, member_drain_times=drains)
    assert state_of(decide_tick(due, FAIR, ME))["closed"] == "1"
    held = decide_acquire(due, ask("chat"), FAIR, ME)
    assert isinstance(held.reply, WaitReply)
    assert state_of(held)["closed"] == "1"
    after_commit = busy_resident(
        waited_ms=3_000, resident_for_ms=3_001, member_drain_times={"chat": (2.0,)}
    )
    dwell = replace(FAIR, min_residency_ms=4_000)
    assert state_of(decide_tick(after_commit, dwell, ME)) == {}
    at_commit = busy_resident(waited_ms=3_001, resident_for_ms=3_001, member_drain_times=drains)
    assert state_of(decide_tick(at_commit, dwell, ME))["closed"] == "1"


def test_a_higher_priority_waiter_closes_a_new_resident_at_once() -> None:
    """A waiter that came after chat's commit but whose priority moves its virtual
    arrival before it (priority 1 at 10 s a level: it ranks as having waited 10 s) closes
    chat at once, minResidency or not: new requests for chat are held from then on."""
    aged = replace(FAIR, min_residency_ms=60_000)
    urgent = busy_resident(waited_ms=100 + aged.priority_aging_ms, resident_for_ms=200)
    d = decide_acquire(urgent, ask("chat"), aged, ME)
    assert isinstance(d.reply, WaitReply)
    assert state_of(d)["closed"] == "1"


def test_min_residency_defaults_to_twice_the_measured_swap() -> None:
    """Unset, minResidency is two mean measured swaps, at least a second."""
    unset = replace(FAIR, min_residency_ms=None)
    assert min_residency_ms(snap(), unset) == 1_000
    assert min_residency_ms(snap(swap_times=(3.0, 5.0)), unset) == 8_000


def test_a_resident_that_drains_slowly_closes_earlier_by_its_measured_drain() -> None:
    """With chat's drains measured (up to 1.5 s), chat closes once coder's waiter has
    waited maxWait less that drain (3.5 s of 5 s), so the drain ends near maxWait; a
    moment earlier it does not; unmeasured, it closes at maxWait as before. The acquire
    that sees it first closes it the same."""
    drains = {"chat": (0.4, 1.5, 0.9)}
    early = busy_resident(waited_ms=3_499, resident_for_ms=60_000, member_drain_times=drains)
    assert state_of(decide_tick(early, FAIR, ME)) == {}
    assert isinstance(decide_acquire(early, ask("chat"), FAIR, ME).reply, Granted)
    due = busy_resident(waited_ms=3_500, resident_for_ms=60_000, member_drain_times=drains)
    d = decide_tick(due, FAIR, ME)
    assert state_of(d)["closed"] == "1"
    assert d.swap is None  # nothing is cut
    held = decide_acquire(due, ask("chat"), FAIR, ME)
    assert isinstance(held.reply, WaitReply)
    assert state_of(held)["closed"] == "1"
    unmeasured = busy_resident(waited_ms=3_500, resident_for_ms=60_000)
    assert state_of(decide_tick(unmeasured, FAIR, ME)) == {}
    # Another member's drains say nothing of chat's.
    other = busy_resident(
        waited_ms=3_500, resident_for_ms=60_000, member_drain_times={"embed": (3.0,)}
    )
    assert state_of(decide_tick(other, FAIR, ME)) == {}


def test_a_members_measured_request_times_count_as_its_drain_too() -> None:
    """Before chat was ever closed, the longest of its recent requests (a stream granted
    just before a close runs its whole length) moves the close as a measured drain does;
    the longer of the two lists counts."""
    requests = {"chat": (0.2, 2.0)}
    early = busy_resident(waited_ms=2_999, resident_for_ms=60_000, member_request_times=requests)
    assert state_of(decide_tick(early, FAIR, ME)) == {}
    due = busy_resident(waited_ms=3_000, resident_for_ms=60_000, member_request_times=requests)
    assert state_of(decide_tick(due, FAIR, ME))["closed"] == "1"
    both = replace(early, member_drain_times={"chat": (0.5,)})
    assert state_of(decide_tick(both, FAIR, ME)) == {}
    longer_drain = replace(early, member_drain_times={"chat": (2.5,)})
    assert state_of(decide_tick(longer_drain, FAIR, ME))["closed"] == "1"


def test_a_drain_estimate_never_overrides_min_residency_or_a_missing_max_wait() -> None:
    """However long chat's measured drains, a young resident is not closed, and without
    maxWait nothing closes."""
    drains = {"chat": (60.0,)}
    young = busy_resident(waited_ms=100, resident_for_ms=1_999, member_drain_times=drains)
    assert "closed" not in state_of(decide_tick(young, FAIR, ME))
    old = busy_resident(waited_ms=100, resident_for_ms=2_000, member_drain_times=drains)
    assert state_of(decide_tick(old, FAIR, ME))["closed"] == "1"
    assert decide_tick(old, POLICY, ME).ops == ()


def test_the_swap_after_a_closed_resident_drained_records_its_drain_once() -> None:
    """The swap that starts once the closed resident's last lease ended records the drain
    (close to now) for that member, and clears the close's moment; a swap from a resident
    that was not closed records nothing."""
    drained = busy_resident(
        waited_ms=9_000, resident_for_ms=60_000, closed=True, closed_ms=NOW - 1_750, leases={}
    )
    d = decide_tick(drained, FAIR, ME)
    assert d.swap is not None
    assert [op for op in d.ops if isinstance(op, RecordDrainTime)] == [
        RecordDrainTime("chat", 1.75)
    ]
    assert state_of(d)["closedat"] == ""
    recorded = replace(drained, closed_ms=0)
    assert not any(isinstance(op, RecordDrainTime) for op in decide_tick(recorded, FAIR, ME).ops)
    idle = snap(resident="chat", waiters={"coder": 1}, urgency={"coder": NOW - 10})
    started = decide_tick(idle, FAIR, ME)
    assert started.swap is not None
    assert not any(isinstance(op, RecordDrainTime) for op in started.ops)


def test_a_closed_residents_own_waiters_do_not_keep_it_busy() -> None:
    """Just after its commit a resident's waiters count as busy, unless they wait
    because it is closed (then they wait for the swap back, and must not block it)."""
    s = snap(resident="chat", committed_ms=NOW - 100, waiters={"chat": 2})
    assert incumbent_busy(s, FAIR, NOT_READ)
    assert not incumbent_busy(replace(s, closed=True), FAIR, NOT_READ)


def test_a_closed_resident_that_drained_is_swapped_for_the_waiter() -> None:
    """Once the closed resident's last lease ended, the tick swaps to the member it was
    closed for, although requests wait for the resident too."""
    drained = busy_resident(
        waited_ms=9_000,
        resident_for_ms=60_000,
        closed=True,
        leases={},
        waiters={"coder": 1, "chat": 3},
        urgency={"coder": NOW - 9_000, "chat": NOW - 1_000},
    )
    d = decide_tick(drained, FAIR, ME)
    assert d.swap is not None
    assert d.swap.target == "coder"


def loading_coder(**fields: object) -> PoolSnapshot:
    """A swap from chat to coder, owned here, loading coder."""
    return snap(
        phase=Phase.LOADING, resident="chat", target="coder", from_member="chat", owner=ME, **fields
    )


def test_the_commit_opens_the_new_resident_and_remembers_the_previous() -> None:
    """A commit clears the closed flag, records the member it replaced and the swap's
    time for the member it loaded."""
    s = loading_coder(started_ms=NOW - 4_000, closed=True)
    d = decide_commit(s, 7, ME)
    assert d is not None
    assert state_of(d)["closed"] == ""
    assert state_of(d)["previous"] == "chat"
    (timed,) = [op for op in d.ops if isinstance(op, RecordSwapTime)]
    assert (timed.member, timed.seconds) == ("coder", 4.0)


def test_a_commit_closes_the_new_resident_for_a_waiter_that_ranks_ahead_of_its_own() -> None:
    """coder loaded for its waiter (priority 0); a chat request of priority 5 came during
    the load: the commit itself closes coder for chat (draining toward it, the close's
    moment kept), so coder's waiter, waking at the commit, is held, not granted. A chat
    waiter that ranks behind coder's leaves the commit open, as before."""
    policy = replace(FAIR, min_residency_ms=0)
    loading = loading_coder(
        started_ms=NOW - 2_000,
        waiters={"coder": 1, "chat": 1},
        urgency={"coder": NOW - 2_100, "chat": NOW - 500 - 5 * policy.priority_aging_ms},
    )
    d = decide_commit(loading, 7, ME, policy)
    assert d is not None
    state = state_of(d)
    assert (state["resident"], state["phase"], state["target"]) == ("coder", "draining", "chat")
    assert (state["closed"], state["closedat"]) == ("1", str(NOW))
    behind = replace(loading, urgency={"coder": NOW - 2_100, "chat": NOW - 500})
    opened = decide_commit(behind, 7, ME, policy)
    assert opened is not None
    assert (state_of(opened)["phase"], state_of(opened)["closed"]) == ("idle", "")


def test_a_swap_back_soon_after_a_swap_is_named_so() -> None:
    """Demand for the previous resident within thrashWindow of the last commit starts a
    swap whose reason is swap_back; after the window, demand."""
    s = snap(resident="coder", previous="chat", committed_ms=NOW - 10_000, waiters={"chat": 1})
    (started,) = decide_tick(s, POLICY, ME).audit
    assert (started.outcome, started.reason) == (PoolOutcome.SWAP_STARTED, SwapReason.SWAP_BACK)
    later = replace(s, committed_ms=NOW - POLICY.thrash_window_ms)
    (started,) = decide_tick(later, POLICY, ME).audit
    assert started.reason == SwapReason.DEMAND


# --- admission from an honest estimate -------------------------------------------------------


def test_a_request_that_cannot_be_served_in_time_is_refused_at_once() -> None:
    """A swap to coder takes 8 s (measured); a request held for 5 s more is refused now
    with eta_over_budget and a Retry-After of the estimate; held for 9 s it waits, told
    its place and the estimate."""
    busy = snap(resident="chat", leases={"chat": 1}, member_swap_times={"coder": (8.0,)})
    short = decide_acquire(busy, ask("coder", hold_ms=5_000), POLICY, ME)
    assert isinstance(short.reply, ErrorReply)
    assert short.reply.code == ErrorCode.ETA_OVER_BUDGET
    assert short.reply.retry_after_s == 8.0
    assert not any(isinstance(op, AddWaiter) for op in short.ops)
    enough = decide_acquire(busy, ask("coder", hold_ms=9_000), POLICY, ME)
    assert isinstance(enough.reply, WaitReply)
    assert (enough.reply.position, enough.reply.eta_s) == (1, 8.0)


def test_the_estimate_counts_the_swap_in_flight_and_the_members_ahead() -> None:
    """A swap to coder has run 3 s of its 8; embed's waiter is ahead of a new request for
    chat: 5 + 6 (embed) + 4 (chat) seconds, third in line."""
    s = snap(
        phase=Phase.LOADING,
        target="coder",
        started_ms=NOW - 3_000,
        waiters={"coder": 1, "embed": 1},
        urgency={"coder": NOW - 9_000, "embed": NOW - 5_000},
        member_swap_times={"coder": (8.0,), "embed": (6.0,), "chat": (4.0,)},
    )
    assert eta_s(s, "chat", NOW) == (15.0, 3)
    # A more urgent request (priority) goes before embed.
    assert eta_s(s, "chat", NOW - 60_000) == (9.0, 2)
    # Its own swap in flight: only what is left of it.
    assert eta_s(s, "coder", NOW) == (5.0, 1)


def test_nothing_measured_admits_everyone() -> None:
    """Before any swap is measured the estimate is 0 s: nobody is refused on a guess."""
    busy = snap(resident="chat", leases={"chat": 1})
    d = decide_acquire(busy, ask("coder", hold_ms=1), POLICY, ME)
    assert isinstance(d.reply, WaitReply)


def test_the_resident_is_granted_whatever_the_budget() -> None:
    """A request for the open resident never meets the estimate."""
    s = snap(resident="chat", member_swap_times={"chat": (50.0,)})
    assert isinstance(decide_acquire(s, ask("chat", hold_ms=1), POLICY, ME).reply, Granted)


# --- warmth -------------------------------------------------------------------------------


IDLE = replace(POLICY, idle_unload_ms={"chat": 60_000, "coder": 60_000}, default="chat")


def test_an_idle_resident_returns_to_the_default() -> None:
    """coder served nothing for idleUnloadAfter (since its last release): the default
    comes back, reason return_to_default; a minute less and nothing happens."""
    s = snap(resident="coder", committed_ms=NOW - 600_000, released_ms=NOW - 60_000)
    d = decide_tick(s, IDLE, ME)
    assert d.swap is not None
    assert d.swap.target == "chat"
    assert [a.reason for a in d.audit] == [SwapReason.RETURN_TO_DEFAULT]
    assert decide_tick(replace(s, released_ms=NOW - 59_999), IDLE, ME).swap is None


def test_an_idle_resident_without_a_default_is_unloaded() -> None:
    """No default: the pool goes cold (reason idle_unload)."""
    s = snap(resident="coder", committed_ms=NOW - 600_000)
    d = decide_tick(s, replace(IDLE, default=None), ME)
    assert d.swap is not None
    assert d.swap.target == ""
    assert [a.reason for a in d.audit] == [SwapReason.IDLE_UNLOAD]


def test_idle_unload_never_takes_a_serving_or_awaited_member_or_the_default() -> None:
    """A live lease, a waiter for it, or being the default keeps the resident."""
    old = {"committed_ms": NOW - 600_000}
    assert decide_tick(snap(resident="coder", leases={"coder": 1}, **old), IDLE, ME).swap is None
    waited = snap(resident="coder", waiters={"coder": 1}, urgency={"coder": NOW}, **old)
    assert decide_tick(waited, IDLE, ME).swap is None
    assert decide_tick(snap(resident="chat", **old), IDLE, ME).swap is None


def test_idle_unload_asks_the_slots_first_under_leases_and_slots() -> None:
    """Under leasesAndSlots the resident's /slots are read before it goes; busy ones keep it."""
    slots = replace(IDLE, busy_signal=BusySignal.LEASES_AND_SLOTS)
    s = snap(resident="coder", committed_ms=NOW - 600_000)
    assert decide_tick(s, slots, ME).need_idle_check == ("coder",)
    assert decide_tick(s, slots, ME, slots_busy={"coder": True}).swap is None
    assert decide_tick(s, slots, ME, slots_busy={"coder": False}).swap is not None


def test_the_pool_view_shows_the_closed_resident_and_the_queue_in_order() -> None:
    """GET /v1/pools says when the resident is closed and who goes next, in order; a
    closed resident's own waiters are in the queue too (they wait for the swap back)."""
    s = busy_resident(
        waited_ms=9_000,
        resident_for_ms=60_000,
        closed=True,
        waiters={"coder": 1, "embed": 1, "chat": 2},
        urgency={"coder": NOW - 9_000, "embed": NOW - 20_000, "chat": NOW - 100},
    )
    view = pool_view(FAIR, s)
    assert view.closed
    assert view.queue == ["embed", "coder", "chat"]
    assert view.queue_waited_s == {"embed": 20.0, "coder": 9.0, "chat": 0.1}
    assert pool_view(FAIR, replace(s, closed=False)).queue == ["embed", "coder"]


def test_a_swap_in_flight_is_expected_to_take_its_targets_own_measured_time() -> None:
    """The view's expected time of a swap in flight is the target's own measured swaps,
    none before one was measured (a fast member's warm-up would make a slow load look
    stuck); at rest it is the pool's mean."""
    measured = {"swap_times": (0.4, 3.0), "member_swap_times": {"chat": (0.4,)}}
    loading = snap(phase=Phase.LOADING, target="coder", started_ms=NOW - 1_000, **measured)
    assert pool_view(POLICY, loading).swap_expected_s is None
    assert pool_view(POLICY, loading).swap_remaining_s is None
    known = replace(loading, member_swap_times={"chat": (0.4,), "coder": (3.0, 5.0)})
    view = pool_view(POLICY, known)
    assert (view.swap_expected_s, view.swap_elapsed_s, view.swap_remaining_s) == (4.0, 1.0, 3.0)
    assert pool_view(POLICY, snap(resident="coder", **measured)).swap_expected_s == 1.7


def just_loaded(waited_ms: int, **fields: object) -> PoolSnapshot:
    """chat resident for 10 ms, idle, its two waiters re-asking; one coder waiter."""
    return busy_resident(
        waited_ms=waited_ms,
        resident_for_ms=10,
        phase=Phase.IDLE,
        target=None,
        leases={},
        waiters={"coder": 1, "chat": 2},
        **fields,
    )


def test_a_new_resident_serves_the_requests_it_came_for_before_it_closes() -> None:
    """Just swapped in for its waiters, a resident is not closed while they re-ask, even
    if another member's waiter already waited maxWait: else every swap would be undone
    before anyone was served (found by the state machine with a 1 ms maxWait)."""
    policy = replace(FAIR, min_residency_ms=0)
    s = just_loaded(60_000, urgency={"coder": NOW - 60_000, "chat": NOW - 70_000})
    d = decide_acquire(s, ask("chat"), policy, ME)
    assert isinstance(d.reply, Granted)
    later = replace(s, committed_ms=NOW - policy.waiter_grace_ms)
    assert isinstance(decide_acquire(later, ask("chat"), policy, ME).reply, WaitReply)


def test_a_more_urgent_waiter_closes_a_new_resident_before_its_own_waiters() -> None:
    """chat was just loaded for its two waiters (priority 0); a coder request of priority
    5 came during the load, so it ranks ahead of them: chat closes at once, and chat's
    waiters re-asking are held for the swap back instead of granted (only what already
    runs drains). A coder waiter that ranks behind chat's (it came later, same priority)
    does not: chat serves its waiters first, as before."""
    policy = replace(FAIR, min_residency_ms=0)
    base = just_loaded(0, member_drain_times={"chat": (6.0,)})
    urgent = replace(
        base, urgency={"coder": NOW - 300 - 5 * policy.priority_aging_ms, "chat": NOW - 2_000}
    )
    d = decide_acquire(urgent, ask("chat"), policy, ME)
    assert isinstance(d.reply, WaitReply)
    assert d.reply.reason == WaitReason.CLOSED
    assert state_of(d)["closed"] == "1"
    assert state_of(decide_tick(urgent, policy, ME))["closed"] == "1"
    behind = replace(base, urgency={"coder": NOW - 300, "chat": NOW - 2_000})
    assert isinstance(decide_acquire(behind, ask("chat"), policy, ME).reply, Granted)
    assert "closed" not in state_of(decide_tick(behind, policy, ME))


def test_another_members_swap_times_never_refuse_a_request() -> None:
    """Only a member's own measured swaps count: the pool's (other members') do not."""
    busy = snap(resident="chat", leases={"chat": 1}, swap_times=(60.0,))
    d = decide_acquire(busy, ask("coder", hold_ms=1_000), POLICY, ME)
    assert isinstance(d.reply, WaitReply)


def test_the_estimate_counts_the_drain_target_ahead_of_it() -> None:
    """Draining toward coder (its waiter came first): a request for embed counts coder's
    swap before its own."""
    s = snap(
        phase=Phase.DRAINING,
        resident="chat",
        target="coder",
        leases={"chat": 1},
        waiters={"coder": 1},
        urgency={"coder": NOW - 5_000},
        member_swap_times={"coder": (8.0,), "embed": (2.0,)},
    )
    assert eta_s(s, "embed", NOW) == (10.0, 2)


# --- a swap still unloading turns to a more urgent member -----------------------------


def unloading_for_coder(**fields: object) -> PoolSnapshot:
    """A swap from chat to coder, owned by ME at epoch 9, still unloading chat; coder's
    request asked 100 ms ago, embed's (priority 5) 50 ms ago."""
    base: dict[str, object] = {
        "phase": Phase.UNLOADING,
        "epoch": 9,
        "owner": ME,
        "target": "coder",
        "from_member": "chat",
        "swap_id": "gpu0-9",
        "waiters": {"coder": 2, "embed": 1},
        "urgency": {"coder": NOW - 100, "embed": NOW - 50 - 5 * POLICY.priority_aging_ms},
    }
    base.update(fields)
    return snap(**base)


def test_a_swap_still_unloading_is_retargeted_to_a_more_urgent_member() -> None:
    """A higher priority waiter for embed came after the swap for coder began: right
    before the load the swap takes embed as its target (same epoch and id, still
    unloading, fenced on the claim and the target it read), audited from coder to embed;
    coder's waiters are left held. Without ``retarget`` it loads coder."""
    s = unloading_for_coder()
    d = decide_begin_load(s, 9, ME, POLICY, retarget=True)
    assert d is not None
    assert state_of(d) == {"target": "embed"}
    assert d.pre.state_equals == {
        "epoch": "9",
        "owner": ME,
        "phase": "unloading",
        "target": "coder",
    }
    (event,) = d.audit
    assert (event.outcome, event.from_member, event.to_member, event.reason, event.swap_id) == (
        PoolOutcome.SWAP_RETARGETED, "coder", "embed", RetargetReason.MORE_URGENT, "gpu0-9"
    )  # fmt: skip
    assert retargeted_to(d) == "embed"
    assert not any(isinstance(op, ClearWaiters) for op in d.ops)
    plain = decide_begin_load(s, 9, ME, POLICY)
    assert plain is not None
    assert state_of(plain)["phase"] == "loading"
    assert retargeted_to(plain) is None
    assert decide_begin_load(s, 8, ME, POLICY, retarget=True) is None  # not its claim


def test_a_swap_keeps_its_target_unless_another_member_is_more_urgent() -> None:
    """Kept: the other waiter came later with the same priority; the swap is forced (an
    operator's); the more urgent member is in its failure backoff; a capacity pool's
    plan; the load began already. A target whose demand left is cancelled as before."""
    later = {"coder": NOW - 100, "embed": NOW - 50}
    capacity = replace(POLICY, capacity_gib=24.0, memory_gib={"chat": 8, "coder": 8, "embed": 8})
    for s, policy in (
        (unloading_for_coder(urgency=later), POLICY),
        (unloading_for_coder(forced=True), POLICY),
        (unloading_for_coder(failures={"embed": 3_000}), POLICY),
        (unloading_for_coder(), capacity),
    ):
        d = decide_begin_load(s, 9, ME, policy, retarget=True)
        assert d is not None
        assert retargeted_to(d) is None, s
        assert state_of(d)["phase"] == "loading", s
    assert (
        decide_begin_load(unloading_for_coder(phase=Phase.LOADING), 9, ME, POLICY, retarget=True)
        is NOTHING
    )
    gone = decide_begin_load(
        unloading_for_coder(waiters={"embed": 1}), 9, ME, POLICY, retarget=True
    )
    assert gone is not None
    (event,) = gone.audit
    assert (event.outcome, event.reason) == (PoolOutcome.SWAP_CANCELLED, "demand_gone_before_load")
