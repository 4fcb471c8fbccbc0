"""The activation contract as pure decisions (PRODUCT.md section 2), no I/O."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hotseat_common.config.model import BusySignal, PoolActivation
from hotseat_common.messages import ErrorReply, Granted, IncumbentBusyReply, PoolOutcome, WaitReply
from hotseat_pool_controller.decisions.acquire import decide_acquire
from hotseat_pool_controller.decisions.admin import decide_admin_swap, decide_admin_unload
from hotseat_pool_controller.decisions.hold import retry_after_s
from hotseat_pool_controller.decisions.recovery import (
    decide_rebuild,
    decide_resident_health,
    decide_resident_lost,
)
from hotseat_pool_controller.decisions.start import next_epoch
from hotseat_pool_controller.decisions.swap import (
    decide_begin_load,
    decide_commit,
    decide_fail,
    decide_heartbeat,
)
from hotseat_pool_controller.decisions.tick import decide_tick
from hotseat_pool_controller.model import (
    NOTHING,
    AcquireAsk,
    AddLease,
    AddWaiter,
    AttemptLease,
    Decision,
    Phase,
    PoolPolicy,
    PoolSnapshot,
    RevokeLeases,
    SetState,
)

NOW = 1_000_000
ME = "ctl-1"
POLICY = PoolPolicy(
    name="gpu0",
    members=("judge", "coder", "small"),
    max_waiters=3,
    lease_ttl_ms=15_000,
    swap_timeout_ms=600_000,
    failure_backoff_ms=5_000,
    busy_signal=BusySignal.LEASES,
    default=None,
)
SLOTS = replace(POLICY, busy_signal=BusySignal.LEASES_AND_SLOTS)

WAIT = PoolActivation.WAIT
IF_IDLE = PoolActivation.IF_IDLE


def snap(**fields: object) -> PoolSnapshot:
    base: dict[str, object] = {"now_ms": NOW, "phase": Phase.IDLE, "epoch": 7, "version": 3}
    base.update(fields)
    return PoolSnapshot(**base)  # type: ignore[arg-type]


def ask(member: str, mode: PoolActivation = WAIT, attempt: str = "r1") -> AcquireAsk:
    return AcquireAsk(member, mode, attempt, "client-1", "router-a", NOW + 300_000, "lease-new")


def test_resident_idle_is_granted_at_once() -> None:
    """A request for the resident member is granted with a lease and the resident's epoch."""
    d = decide_acquire(snap(resident="judge"), ask("judge"), POLICY, ME)
    assert isinstance(d.reply, Granted)
    assert d.reply.epoch == 7
    assert any(isinstance(op, AddLease) and op.expiry_ms == NOW + 15_000 for op in d.ops)
    assert d.swap is None
    assert not d.changes_state


@pytest.mark.parametrize("mode", [WAIT, IF_IDLE])
def test_resident_busy_still_coalesces(mode: PoolActivation) -> None:
    """Same-model demand coalesces onto the warm member even while it serves others."""
    d = decide_acquire(snap(resident="judge", leases={"judge": 5}), ask("judge", mode), POLICY, ME)
    assert isinstance(d.reply, Granted)


def test_resident_granted_while_others_wait_for_drain() -> None:
    """Sticky residency: draining toward another member does not hold the resident's requests."""
    s = snap(
        phase=Phase.DRAINING,
        resident="judge",
        target="coder",
        leases={"judge": 1},
        waiters={"coder": 2},
    )
    assert isinstance(decide_acquire(s, ask("judge"), POLICY, ME).reply, Granted)


@pytest.mark.parametrize("phase", [Phase.UNLOADING, Phase.LOADING])
@pytest.mark.parametrize("mode", [WAIT, IF_IDLE])
@pytest.mark.parametrize("member", ["judge", "coder", "small"])
def test_swap_in_flight_is_waited_on_in_both_modes(
    phase: Phase, mode: PoolActivation, member: str
) -> None:
    """During a swap every request waits (the incumbent cannot serve either way)."""
    s = snap(phase=phase, resident="judge", target="coder", started_ms=NOW - 1000)
    d = decide_acquire(s, ask(member, mode), POLICY, ME)
    assert isinstance(d.reply, WaitReply)
    assert d.reply.reason == "swap_in_flight"
    assert d.swap is None
    assert any(isinstance(op, AddWaiter) for op in d.ops)


@pytest.mark.parametrize("mode", [WAIT, IF_IDLE])
def test_idle_incumbent_starts_a_swap(mode: PoolActivation) -> None:
    """Not resident, incumbent idle: drain, unload, load — the request is held for it."""
    d = decide_acquire(snap(resident="judge"), ask("coder", mode), POLICY, ME)
    assert isinstance(d.reply, WaitReply)
    assert d.swap is not None
    assert d.swap.target == "coder"
    assert d.swap.from_member == "judge"
    assert d.swap.epoch > 7
    assert d.pre.zero_leases == ("judge",)
    state = next(op for op in d.ops if isinstance(op, SetState))
    assert state.fields["phase"] == "unloading"
    assert state.fields["owner"] == ME
    assert [a.outcome for a in d.audit] == [PoolOutcome.SWAP_STARTED]


@pytest.mark.parametrize("mode", [WAIT, IF_IDLE])
def test_cold_pool_counts_as_idle(mode: PoolActivation) -> None:
    """A cold pool starts loading the requested member in both modes."""
    d = decide_acquire(snap(), ask("coder", mode), POLICY, ME)
    assert d.swap is not None
    assert d.swap.target == "coder"
    assert d.swap.from_member is None
    assert d.pre.zero_leases == ()


def test_if_idle_busy_incumbent_answers_busy_without_side_effects() -> None:
    """IfIdle + busy incumbent: incumbent_busy at once, no waiter, no swap, no write."""
    d = decide_acquire(
        snap(resident="judge", leases={"judge": 1}), ask("coder", IF_IDLE), POLICY, ME
    )
    assert isinstance(d.reply, IncumbentBusyReply)
    assert d.reply.resident == "judge"
    assert d.reply.retry_after_s >= 1
    assert d.ops == ()
    assert d.swap is None


def test_wait_busy_incumbent_becomes_a_waiter_and_drains() -> None:
    """Wait + busy incumbent: held as a waiter, the pool starts draining toward it, no swap yet."""
    d = decide_acquire(snap(resident="judge", leases={"judge": 1}), ask("coder"), POLICY, ME)
    assert isinstance(d.reply, WaitReply)
    assert d.reply.reason == "draining"
    assert d.swap is None
    fields = next(op for op in d.ops if isinstance(op, SetState)).fields
    assert fields == {"phase": "draining", "target": "coder", "cause": "client-1"}


def test_if_idle_while_draining_is_busy() -> None:
    """A waiter for a busy incumbent is not a swap: under IfIdle the incumbent counts as busy."""
    s = snap(
        phase=Phase.DRAINING,
        resident="judge",
        target="coder",
        leases={"judge": 1},
        waiters={"coder": 1},
    )
    assert isinstance(
        decide_acquire(s, ask("small", IF_IDLE), POLICY, ME).reply, IncumbentBusyReply
    )
    assert isinstance(
        decide_acquire(s, ask("coder", IF_IDLE), POLICY, ME).reply, IncumbentBusyReply
    )


def test_resident_waiters_count_as_busy_just_after_a_swap() -> None:
    """The new resident's waiters (re-asking now) keep it from being swapped away at once;
    long after the swap, a waiter left by a dead router no longer pins it."""
    fresh = snap(resident="coder", waiters={"coder": 2}, committed_ms=NOW - 1000)
    d = decide_acquire(fresh, ask("judge", IF_IDLE), POLICY, ME)
    assert isinstance(d.reply, IncumbentBusyReply)
    stale = replace(fresh, committed_ms=NOW - 60_000)
    assert decide_acquire(stale, ask("judge", IF_IDLE), POLICY, ME).swap is not None


def test_refused_waiter_leaves_the_queue() -> None:
    """A waiting request that is then told busy is removed from the waiters at once."""
    s = snap(resident="judge", leases={"judge": 1}, attempt_waiting=True)
    d = decide_acquire(s, ask("coder", IF_IDLE), POLICY, ME)
    assert isinstance(d.reply, IncumbentBusyReply)
    assert [type(op).__name__ for op in d.ops] == ["RemoveWaiter"]


def test_draining_with_idle_incumbent_swaps_to_the_pending_target() -> None:
    """When the incumbent drained, the earlier demand (the draining target) goes first."""
    s = snap(phase=Phase.DRAINING, resident="judge", target="coder", waiters={"coder": 1})
    d = decide_acquire(s, ask("small"), POLICY, ME)
    assert d.swap is not None
    assert d.swap.target == "coder"
    assert any(isinstance(op, AddWaiter) and op.member == "small" for op in d.ops)


def test_queue_full_rejects_new_waiters_only() -> None:
    """maxWaiters caps held requests; a request already waiting may keep asking."""
    s = snap(phase=Phase.LOADING, resident=None, target="coder", waiters={"coder": 3})
    full = decide_acquire(s, ask("coder"), POLICY, ME)
    assert isinstance(full.reply, ErrorReply)
    assert full.reply.code == "pool_queue_full"
    assert full.reply.retry_after_s is not None
    again = decide_acquire(replace(s, attempt_waiting=True), ask("coder"), POLICY, ME)
    assert isinstance(again.reply, WaitReply)
    assert again.pre.waiter_cap is None


def test_retried_acquire_gets_the_same_lease() -> None:
    """A retried acquire with the same request id yields the lease it already holds."""
    s = snap(resident="judge", attempt_lease=AttemptLease("judge", "lease-old", 7))
    d = decide_acquire(s, ask("judge"), POLICY, ME)
    assert isinstance(d.reply, Granted)
    assert d.reply.lease_id == "lease-old"
    assert d.ops == ()


def test_failed_member_fails_fast_during_backoff() -> None:
    """After a failed swap, acquires for that member answer swap_failed until the backoff ends."""
    d = decide_acquire(snap(failures={"coder": 2500}), ask("coder"), POLICY, ME)
    assert isinstance(d.reply, ErrorReply)
    assert d.reply.code == "swap_failed"
    assert d.reply.retry_after_s == 2.5


def test_unknown_state_waits_for_reconcile() -> None:
    """Nothing is granted while the state is being rebuilt."""
    d = decide_acquire(snap(phase=Phase.UNKNOWN), ask("judge"), POLICY, ME)
    assert isinstance(d.reply, WaitReply)
    assert d.reply.reason == "reconciling"


def test_unknown_member_is_an_error() -> None:
    """A member the pool does not have is refused."""
    d = decide_acquire(snap(), ask("nope"), POLICY, ME)
    assert isinstance(d.reply, ErrorReply)
    assert d.reply.code == "unknown_pool"


def test_slots_are_consulted_before_a_swap_and_fail_closed() -> None:
    """busySignal leasesAndSlots: /slots is checked before starting a swap; busy slots mean busy."""
    s = snap(resident="judge")
    need = decide_acquire(s, ask("coder", IF_IDLE), SLOTS, ME)
    assert need.need_idle_check == ("judge",)
    assert need.ops == ()
    busy = decide_acquire(s, ask("coder", IF_IDLE), SLOTS, ME, slots_busy={"judge": True})
    assert isinstance(busy.reply, IncumbentBusyReply)
    idle = decide_acquire(s, ask("coder", IF_IDLE), SLOTS, ME, slots_busy={"judge": False})
    assert idle.swap is not None


@pytest.mark.parametrize("action", ["swap", "unload"])
def test_admin_swap_and_unload_never_cut_a_busy_incumbent(action: str) -> None:
    """Live leases refuse an admin swap or unload; under leasesAndSlots the incumbent's
    /slots is consulted first, and busy slots refuse it too."""

    def admin(s: PoolSnapshot, policy: PoolPolicy, busy: bool | None) -> Decision:
        read = {} if busy is None else {"judge": busy}
        if action == "swap":
            return decide_admin_swap(s, "coder", ME, policy, slots_busy=read)
        return decide_admin_unload(s, ME, policy, slots_busy=read)

    idle = snap(resident="judge")
    assert admin(idle, POLICY, None).swap is not None  # leases only: no slots asked
    need = admin(idle, SLOTS, None)
    assert need.need_idle_check == ("judge",)
    assert need.ops == ()
    busy = admin(idle, SLOTS, True)
    assert isinstance(busy.reply, ErrorReply)
    assert busy.reply.code == "incumbent_busy"
    assert busy.ops == ()
    assert busy.swap is None
    assert admin(idle, SLOTS, False).swap is not None
    leased = admin(snap(resident="judge", leases={"judge": 1}), SLOTS, False)
    assert isinstance(leased.reply, ErrorReply)
    assert leased.reply.code == "incumbent_busy"


def test_retry_after_comes_from_measured_swaps() -> None:
    """Retry-After estimates from the pool's swap times (minus elapsed), at least 1 s."""
    assert retry_after_s(snap(swap_times=(8.0, 12.0))) == 10.0
    in_flight = snap(phase=Phase.LOADING, swap_times=(8.0, 12.0), started_ms=NOW - 4000)
    assert retry_after_s(in_flight) == 6.0
    assert retry_after_s(snap(swap_times=(0.2,))) == 1.0


def test_epochs_strictly_increase_even_after_state_loss() -> None:
    """Epochs come from max(last + 1, clock): above any epoch issued before a Redis wipe."""
    assert next_epoch(snap(epoch=5)) == NOW
    assert next_epoch(snap(epoch=NOW + 10)) == NOW + 11


# --- ticks ----------------------------------------------------------------------------


def test_tick_starts_the_swap_once_the_incumbent_drains() -> None:
    """Draining + incumbent idle + demand: the swap starts (guarded by zero leases)."""
    s = snap(phase=Phase.DRAINING, resident="judge", target="coder", waiters={"coder": 1})
    d = decide_tick(s, POLICY, ME)
    assert d.swap is not None
    assert d.swap.target == "coder"
    assert d.pre.zero_leases == ("judge",)


def test_tick_cancels_a_pending_swap_whose_demand_left() -> None:
    """Demand gone before the load: the pending swap is cancelled; the busy incumbent stays."""
    s = snap(phase=Phase.DRAINING, resident="judge", target="coder", leases={"judge": 2})
    d = decide_tick(s, POLICY, ME)
    assert d.swap is None
    assert [a.outcome for a in d.audit] == [PoolOutcome.SWAP_CANCELLED]
    fields = next(op for op in d.ops if isinstance(op, SetState)).fields
    assert fields == {"phase": "idle", "target": "", "closed": ""}
    assert "resident" not in fields
    assert d.pre.zero_waiters == ("coder",)


def test_tick_waits_while_the_incumbent_serves() -> None:
    """Draining with a busy incumbent: nothing happens."""
    s = snap(
        phase=Phase.DRAINING,
        resident="judge",
        target="coder",
        leases={"judge": 1},
        waiters={"coder": 1},
    )
    assert decide_tick(s, POLICY, ME).ops == ()


def test_tick_warms_the_default_on_a_cold_pool() -> None:
    """A pool with a default member loads it when found cold (a forced swap)."""
    policy = replace(POLICY, default="small")
    d = decide_tick(snap(), policy, ME)
    assert d.swap is not None
    assert d.swap.target == "small"
    assert next(op for op in d.ops if isinstance(op, SetState)).fields["forced"] == "1"
    assert decide_tick(snap(parked=True), policy, ME).swap is None
    assert decide_tick(snap(resident="judge"), policy, ME).swap is None


def test_tick_takes_over_a_swap_whose_owner_went_silent() -> None:
    """A lapsed heartbeat: another replica resumes the swap in the phase it was in, under a
    newer epoch; taken over in loading, the target's load runs on (it had started)."""
    for phase in (Phase.UNLOADING, Phase.LOADING):
        s = snap(phase=phase, target="coder", owner="ctl-dead", heartbeat_ms=NOW - 1)
        d = decide_tick(s, POLICY, ME)
        assert d.swap is not None
        assert d.swap.resume
        assert d.swap.epoch > 7
        assert d.swap.loading is (phase == Phase.LOADING)
        fields = next(op for op in d.ops if isinstance(op, SetState)).fields
        assert "phase" not in fields
        assert fields["owner"] == ME
    alive = replace(s, heartbeat_ms=NOW + 1)
    assert decide_tick(alive, POLICY, ME).swap is None


def test_tick_serves_waiters_left_after_a_swap() -> None:
    """Waiters for another member after a swap: drain toward them, then swap."""
    s = snap(resident="coder", leases={"coder": 1}, waiters={"judge": 1})
    d = decide_tick(s, POLICY, ME)
    assert next(op for op in d.ops if isinstance(op, SetState)).fields == {
        "phase": "draining",
        "target": "judge",
    }


# --- swap steps -------------------------------------------------------------------------


def owned(**fields: object) -> PoolSnapshot:
    base: dict[str, object] = {
        "phase": Phase.UNLOADING,
        "target": "coder",
        "from_member": "judge",
        "owner": ME,
        "epoch": 9,
    }
    return snap(**{**base, **fields})


def test_begin_load_cancels_when_demand_left_before_the_load() -> None:
    """No waiter for the target when its load would start: cancel, pool left cold."""
    d = decide_begin_load(owned(), 9, ME)
    assert d is not None
    assert [a.outcome for a in d.audit] == [PoolOutcome.SWAP_CANCELLED]
    go = decide_begin_load(owned(waiters={"coder": 1}), 9, ME)
    assert go is not None
    assert next(op for op in go.ops if isinstance(op, SetState)).fields == {
        "phase": "loading",
        "loading": str(NOW),
    }
    forced = decide_begin_load(owned(forced=True), 9, ME)
    assert forced is not None
    assert forced.audit == ()


def test_steps_are_refused_to_a_stale_owner() -> None:
    """A swap step of an older epoch or another owner is not applied (fencing)."""
    s = owned(waiters={"coder": 1})
    assert decide_begin_load(s, 8, ME) is None
    assert decide_commit(s, 9, "ctl-2") is None
    assert decide_fail(s, POLICY, 8, ME, "x") is None
    assert decide_heartbeat(s, POLICY, 8, ME) is None
    beat = decide_heartbeat(s, POLICY, 9, ME)
    assert beat is not None
    assert beat.pre.state_equals == {"epoch": "9", "owner": ME}


def test_commit_makes_the_target_resident() -> None:
    """Commit: idle with the target resident, swap time recorded, swap_completed audited."""
    d = decide_commit(owned(phase=Phase.LOADING, started_ms=NOW - 2500), 9, ME)
    assert d is not None
    fields = next(op for op in d.ops if isinstance(op, SetState)).fields
    assert fields["resident"] == "coder"
    assert fields["phase"] == "idle"
    assert [a.outcome for a in d.audit] == [PoolOutcome.SWAP_COMPLETED]


def test_fail_leaves_pool_cold_and_backs_off() -> None:
    """Failure: pool cold, the target's waiters removed, a fast-fail backoff set."""
    d = decide_fail(owned(phase=Phase.LOADING), POLICY, 9, ME, "oom")
    assert d is not None
    fields = next(op for op in d.ops if isinstance(op, SetState)).fields
    assert fields["resident"] == ""
    assert [a.outcome for a in d.audit] == [PoolOutcome.SWAP_FAILED]
    assert d.audit[0].reason == "oom"


def test_resident_lost_forgets_the_dead_member() -> None:
    """A dead resident: resident_lost, the pool becomes cold with a new epoch."""
    d = decide_resident_lost(snap(resident="judge"), "judge", "health")
    assert [a.outcome for a in d.audit] == [PoolOutcome.RESIDENT_LOST]
    fields = next(op for op in d.ops if isinstance(op, SetState)).fields
    assert fields["resident"] == ""
    assert int(fields["epoch"]) > 7
    assert decide_resident_lost(snap(resident="coder"), "judge", "health").ops == ()


def test_rebuild_only_from_unknown() -> None:
    """A lost state is rebuilt from the drivers' view; a known state is left alone."""
    d = decide_rebuild(snap(phase=Phase.UNKNOWN), ("judge",))
    assert d.pre.state_unknown
    assert next(op for op in d.ops if isinstance(op, SetState)).fields["resident"] == "judge"
    assert decide_rebuild(snap(), ("judge",)).ops == ()


def test_begin_load_after_a_takeover_in_loading_never_cancels() -> None:
    """Once the target's load began, missing demand no longer cancels the swap."""
    s = snap(phase=Phase.LOADING, target="coder", owner=ME, epoch=9, waiters={})
    assert decide_begin_load(s, 9, ME) is NOTHING
    unloading = replace(s, phase=Phase.UNLOADING)
    cancelled = decide_begin_load(unloading, 9, ME)
    assert cancelled is not None
    assert [a.outcome for a in cancelled.audit] == [PoolOutcome.SWAP_CANCELLED]


def test_if_idle_is_not_held_for_a_swap_that_serves_another_member() -> None:
    """IfIdle for writer: a drained pool about to swap to coder's waiters starts that swap
    and answers busy at once; a swap in flight to coder's waiters is not waited on either;
    a swap in flight with no waiters of its own (a warm-up) is still waited on."""
    members = (*POLICY.members, "writer")
    policy = replace(POLICY, members=members)
    draining = snap(phase=Phase.DRAINING, resident="judge", target="coder", waiters={"coder": 1})
    d = decide_acquire(draining, ask("writer", IF_IDLE), policy, ME)
    assert isinstance(d.reply, IncumbentBusyReply)
    assert d.swap is not None
    assert d.swap.target == "coder"
    assert not any(isinstance(op, AddWaiter) for op in d.ops)
    in_flight = replace(draining, phase=Phase.LOADING)
    assert isinstance(decide_acquire(in_flight, ask("writer", IF_IDLE), policy, ME).reply,
                      IncumbentBusyReply)  # fmt: skip
    warm_up = replace(in_flight, waiters={})
    assert isinstance(decide_acquire(warm_up, ask("writer", IF_IDLE), policy, ME).reply, WaitReply)
    waited = decide_acquire(in_flight, ask("writer", WAIT), policy, ME)
    assert isinstance(waited.reply, WaitReply)


def test_a_resident_that_serves_is_never_declared_lost() -> None:
    """resident_lost needs no live lease and no relearning (and checks it atomically);
    only a confirmed-gone member is lost while serving, and its leases go with it."""
    serving = snap(resident="judge", leases={"judge": 1})
    assert decide_resident_lost(serving, "judge", "health") is NOTHING
    relearning = snap(resident="judge", relearn_ms=NOW + 1000)
    assert decide_resident_lost(relearning, "judge", "health") is NOTHING
    idle = decide_resident_lost(snap(resident="judge"), "judge", "health")
    assert idle.pre.zero_leases == ("judge",)
    revoked = decide_resident_lost(serving, "judge", "gone", revoke=True)
    assert RevokeLeases("judge") in revoked.ops
    assert [a.outcome for a in revoked.audit] == [PoolOutcome.RESIDENT_LOST]


def test_an_unhealthy_resident_is_held_or_skipped_then_recovered_once_idle() -> None:
    """Marked unhealthy while serving: IfIdle skips it, Wait waits for it (never a grant);
    the tick declares it lost once its last lease has ended."""
    s = snap(resident="judge", leases={"judge": 1}, unhealthy=True)
    assert isinstance(
        decide_acquire(s, ask("judge", IF_IDLE), POLICY, ME).reply, IncumbentBusyReply
    )
    waited = decide_acquire(s, ask("judge", WAIT), POLICY, ME)
    assert isinstance(waited.reply, WaitReply)
    assert waited.reply.reason == "recovering"
    assert AddWaiter("judge", "r1", NOW + 300_000) in waited.ops
    assert decide_tick(s, POLICY, ME) is NOTHING
    idle = replace(s, leases={})
    lost = decide_tick(idle, POLICY, ME)
    assert [a.outcome for a in lost.audit] == [PoolOutcome.RESIDENT_LOST]
    marked = decide_resident_health(snap(resident="judge"), "judge", healthy=False)
    assert marked.ops == (SetState({"unhealthy": "1"}),)
    assert decide_resident_health(s, "judge", healthy=False) is NOTHING
    cleared = decide_resident_health(s, "judge", healthy=True)
    assert cleared.ops == (SetState({"unhealthy": ""}),)


def test_a_rebuilt_resident_is_busy_while_the_store_relearns() -> None:
    """After a rebuild the resident counts as busy for the relearn window (Wait drains,
    IfIdle skips); once it passes, an idle resident is swapped as usual."""
    rebuilt = decide_rebuild(snap(phase=Phase.UNKNOWN), ("judge",), relearn_ms=3000)
    fields = next(op for op in rebuilt.ops if isinstance(op, SetState)).fields
    assert int(fields["relearn"]) == NOW + 3000
    s = snap(resident="judge", relearn_ms=NOW + 3000)
    assert isinstance(
        decide_acquire(s, ask("coder", IF_IDLE), POLICY, ME).reply, IncumbentBusyReply
    )
    waited = decide_acquire(s, ask("coder", WAIT), POLICY, ME)
    assert isinstance(waited.reply, WaitReply)
    assert waited.reply.reason == "draining"
    later = replace(s, now_ms=NOW + 3001)
    assert decide_acquire(later, ask("coder", WAIT), POLICY, ME).swap is not None
