"""Swap ids as pure decisions: every swap gets one when it starts, keeps it through a
takeover, and hands it to its events, its waiters and the requests it serves; the request
that caused a swap is named on its ``swap_started`` event; the terminal event carries the
phase times."""

from __future__ import annotations

import pytest

from hotseat_common.messages import Granted, IncumbentBusyReply, PoolOutcome, WaitReply
from hotseat_pool_controller.decisions.acquire import decide_acquire
from hotseat_pool_controller.decisions.admin import decide_admin_swap
from hotseat_pool_controller.decisions.start import swap_id_of
from hotseat_pool_controller.decisions.swap import decide_begin_load, decide_commit, decide_fail
from hotseat_pool_controller.decisions.tick import decide_tick
from hotseat_pool_controller.model import Decision, Phase, PoolSnapshot, SetState
from tests.controller.test_state import IF_IDLE, ME, NOW, POLICY, WAIT, ask, snap


def state(d: Decision) -> dict[str, str]:
    fields: dict[str, str] = {}
    for op in d.ops:
        if isinstance(op, SetState):
            fields |= op.fields
    return fields


def in_flight(**fields: object) -> PoolSnapshot:
    base: dict[str, object] = {
        "phase": Phase.UNLOADING,
        "resident": "judge",
        "from_member": "judge",
        "target": "coder",
        "owner": ME,
        "epoch": 9,
        "started_ms": NOW - 3000,
        "swap_id": "gpu0-9",
        "heartbeat_ms": NOW + 1000,
    }
    return snap(**(base | fields))


def test_a_swap_started_by_a_request_names_it_and_gets_an_id() -> None:
    """The acquire that starts a swap: the state, the order, the ``swap_started`` event and
    the request's own wait answer all carry one new id; the event names the request."""
    d = decide_acquire(snap(resident="judge"), ask("coder"), POLICY, ME)
    assert d.swap is not None
    swap_id = swap_id_of("gpu0", d.swap.epoch)
    assert d.swap.swap_id == swap_id
    assert state(d)["swap"] == swap_id
    assert isinstance(d.reply, WaitReply)
    assert d.reply.swap_id == swap_id
    (started,) = d.audit
    assert (started.outcome, started.swap_id, started.request_id) == (
        PoolOutcome.SWAP_STARTED,
        swap_id,
        "client-1",
    )


def test_two_swaps_never_share_an_id() -> None:
    """Each swap's id is new: a later swap of the pool (a newer epoch) gets another."""
    first = decide_acquire(snap(resident="judge"), ask("coder"), POLICY, ME)
    assert first.swap is not None
    after = snap(resident="coder", epoch=first.swap.epoch, swap_id=first.swap.swap_id)
    second = decide_acquire(after, ask("judge"), POLICY, ME)
    assert second.swap is not None
    assert first.swap.swap_id != second.swap.swap_id


@pytest.mark.parametrize("phase", [Phase.UNLOADING, Phase.LOADING])
@pytest.mark.parametrize("member", ["coder", "small"])
def test_requests_held_through_a_swap_are_told_its_id(phase: Phase, member: str) -> None:
    """Every request held while a swap is in flight hears that swap's id, whichever member
    it asked for (and its target, so it can tell whether the swap is its own)."""
    d = decide_acquire(in_flight(phase=phase), ask(member), POLICY, ME)
    assert isinstance(d.reply, WaitReply)
    assert (d.reply.swap_id, d.reply.target) == ("gpu0-9", "coder")


def test_a_request_turned_away_by_a_swap_hears_its_id() -> None:
    """IfIdle for another member while a swap loads coder for its waiters: told busy, with
    the id of the swap in the way."""
    d = decide_acquire(in_flight(waiters={"coder": 1}), ask("small", IF_IDLE), POLICY, ME)
    assert isinstance(d.reply, IncumbentBusyReply)
    assert d.reply.swap_id == "gpu0-9"


def test_a_drain_is_not_yet_a_swap() -> None:
    """Held behind a busy incumbent: no swap exists yet, so no id is given (and none from
    the last swap), but the request that began the drain is kept as its cause."""
    s = snap(resident="judge", leases={"judge": 1}, swap_id="gpu0-5")
    d = decide_acquire(s, ask("coder"), POLICY, ME)
    assert isinstance(d.reply, WaitReply)
    assert d.reply.swap_id is None
    assert state(d)["cause"] == "client-1"


def test_the_drained_swap_names_the_request_that_began_the_drain() -> None:
    """The incumbent drained (its last lease gone): the swap the tick starts for the
    waiters names the request that set the pool draining."""
    s = snap(
        phase=Phase.DRAINING, resident="judge", target="coder", waiters={"coder": 2},
        urgency={"coder": NOW - 5000}, cause="first-waiter",
    )  # fmt: skip
    d = decide_tick(s, POLICY, ME)
    assert d.swap is not None
    (started,) = d.audit
    assert (started.request_id, started.swap_id) == ("first-waiter", d.swap.swap_id)
    assert state(d)["cause"] == ""


def test_a_drained_swap_started_by_a_later_request_still_names_the_first() -> None:
    """A later request of the same member finds the drain done and starts the swap: the
    cause is still the request that began the drain."""
    s = snap(
        phase=Phase.DRAINING, resident="judge", target="coder", waiters={"coder": 1},
        cause="first-waiter",
    )  # fmt: skip
    d = decide_acquire(s, ask("coder"), POLICY, ME)
    assert d.swap is not None
    (started,) = d.audit
    assert started.request_id == "first-waiter"


def test_an_admin_swap_names_no_request() -> None:
    """A swap an operator forced has an id and no causing request (its reason says admin)."""
    d = decide_admin_swap(snap(resident="judge"), "coder", ME, POLICY)
    (started,) = d.audit
    assert started.swap_id is not None
    assert started.request_id is None
    assert started.reason == "admin"


def test_a_takeover_keeps_the_swap_id() -> None:
    """Another replica takes over a swap whose owner went silent: a newer epoch fences the
    old owner, but the swap (and its id) stay the same."""
    s = in_flight(owner="ctl-dead", heartbeat_ms=NOW - 1)
    d = decide_tick(s, POLICY, ME)
    assert d.swap is not None
    assert d.swap.epoch > 9
    assert d.swap.swap_id == "gpu0-9"
    assert "swap" not in state(d)


def test_the_waiter_served_after_the_swap_is_told_its_id() -> None:
    """Granted after waiting: the grant carries the id of the swap that made its member
    resident; a request that never waited is granted with none."""
    s = snap(resident="coder", swap_id="gpu0-9", attempt_waiting=True)
    waited = decide_acquire(s, ask("coder"), POLICY, ME)
    assert isinstance(waited.reply, Granted)
    assert waited.reply.swap_id == "gpu0-9"
    fresh = decide_acquire(snap(resident="coder", swap_id="gpu0-9"), ask("coder"), POLICY, ME)
    assert isinstance(fresh.reply, Granted)
    assert fresh.reply.swap_id is None


def test_the_swap_events_carry_its_id_and_phase_times() -> None:
    """Begin load records when the load began; the commit's ``swap_completed`` carries the
    id, the unloading time and the loading time on the store's clock."""
    begin = decide_begin_load(in_flight(waiters={"coder": 1}), 9, ME)
    assert begin is not None
    assert state(begin)["loading"] == str(NOW)
    loading = in_flight(phase=Phase.LOADING, loading_ms=NOW - 1000)
    commit = decide_commit(loading, 9, ME)
    assert commit is not None
    (completed,) = commit.audit
    assert completed.outcome == PoolOutcome.SWAP_COMPLETED
    assert (completed.swap_id, completed.unload_ms, completed.load_ms) == ("gpu0-9", 2000, 1000)


def test_a_swap_failed_in_its_unload_has_no_load_time() -> None:
    """A swap that failed before its load began reports its unloading time only."""
    fail = decide_fail(in_flight(), POLICY, 9, ME, "swap_timeout")
    assert fail is not None
    (failed,) = fail.audit
    assert (failed.swap_id, failed.unload_ms, failed.load_ms) == ("gpu0-9", 3000, None)


def test_a_swap_cancelled_before_its_load_carries_its_id() -> None:
    """The demand left before the load: ``swap_cancelled`` carries the swap's id."""
    d = decide_begin_load(in_flight(), 9, ME)
    assert d is not None
    (cancelled,) = d.audit
    assert (cancelled.outcome, cancelled.swap_id) == (PoolOutcome.SWAP_CANCELLED, "gpu0-9")


def test_wait_for_a_member_while_idle_resident_grants() -> None:
    """A grant with no swap involved carries no id (the mode does not matter)."""
    for mode in (WAIT, IF_IDLE):
        d = decide_acquire(snap(resident="judge"), ask("judge", mode), POLICY, ME)
        assert isinstance(d.reply, Granted)
        assert d.reply.swap_id is None
