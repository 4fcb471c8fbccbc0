"""When a pool's supervisor may rest (docs/adr/0011): :func:`rest_for_ms` as a pure
decision. A pool rests, busy or not, no later than the first moment a tick would decide
something by itself (a lease expiring, a waiter giving up, a swap owner going silent, an
idle unload, a backoff or a relearning window ending); a pool read without those
deadlines, in doubt, with a decision to take now, or whose resident ``maxWait`` may close,
does not rest. Property: whenever it rests, ``decide_tick`` decides nothing now nor just
before the moment it named."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from hotseat_common.config.model import BusySignal
from hotseat_pool_controller.decisions.busy import all_idle
from hotseat_pool_controller.decisions.tick import decide_tick, rest_for_ms
from hotseat_pool_controller.model import NOTHING, Phase, PoolPolicy, PoolSnapshot

NOW = 10_000_000
ME = "ctl-1"
POLICY = PoolPolicy(
    name="gpu0",
    members=("chat", "coder"),
    max_waiters=100,
    lease_ttl_ms=15_000,
    swap_timeout_ms=600_000,
    failure_backoff_ms=5_000,
    busy_signal=BusySignal.LEASES,
    default="chat",
)


def snap(**fields: object) -> PoolSnapshot:
    base: dict[str, object] = {
        "now_ms": NOW,
        "phase": Phase.IDLE,
        "resident": "chat",
        "epoch": 7,
        "version": 3,
    }
    base.update(fields)
    return PoolSnapshot(**base)  # type: ignore[arg-type]


def test_a_warm_default_with_nothing_going_on_rests_without_a_deadline() -> None:
    assert rest_for_ms(snap(), POLICY, ME) == math.inf


def test_a_busy_pool_rests_until_its_first_deadline() -> None:
    leased = snap(leases={"chat": 2}, lease_expiry={"chat": NOW + 4_000})
    assert rest_for_ms(leased, POLICY, ME) == 4_000
    behind = snap(
        leases={"chat": 1},
        lease_expiry={"chat": NOW + 9_000},
        waiters={"coder": 1},
        waiter_deadline={"coder": NOW + 3_000},
        urgency={"coder": NOW - 100},
        phase=Phase.DRAINING,
        target="coder",
    )
    assert rest_for_ms(behind, POLICY, ME) == 3_000
    loading = snap(phase=Phase.LOADING, target="coder", heartbeat_ms=NOW + 1_500)
    assert rest_for_ms(loading, POLICY, ME) == 1_501
    just_in = snap(
        waiters={"chat": 1}, waiter_deadline={"chat": NOW + 60_000}, committed_ms=NOW - 1_000
    )
    assert rest_for_ms(just_in, POLICY, ME) == POLICY.waiter_grace_ms - 1_000
    # Serving, its idle unload cannot fall due before idleUnloadAfter from now.
    idle = replace(POLICY, idle_unload_ms={"coder": 60_000})
    serving = snap(resident="coder", leases={"coder": 1}, lease_expiry={"coder": NOW + 90_000})
    assert rest_for_ms(serving, idle, ME) == 60_000


def test_doubt_a_decision_due_or_a_pool_read_without_deadlines_keeps_it_ticking() -> None:
    max_wait = replace(POLICY, max_wait_ms=30_000)
    ticking = [
        (snap(leases={"chat": 1}), POLICY),  # read without its deadlines
        (snap(waiters={"coder": 1}), POLICY),
        (snap(phase=Phase.LOADING, target="coder", heartbeat_ms=NOW - 1), POLICY),  # take over
        (snap(phase=Phase.DRAINING, target="coder"), POLICY),  # its waiters left: retarget
        (snap(phase=Phase.UNKNOWN), POLICY),
        (snap(unhealthy=True), POLICY),
        (snap(resident=None), POLICY),  # cold with a default: the tick warms it now
        (
            snap(
                leases={"chat": 1},
                lease_expiry={"chat": NOW + 9_000},
                waiters={"coder": 1},
                waiter_deadline={"coder": NOW + 9_000},
            ),
            max_wait,  # maxWait may close chat for coder
        ),
        (snap(), replace(POLICY, capacity_gib=24.0)),
    ]
    for state, policy in ticking:
        assert rest_for_ms(state, policy, ME) is None, state


def test_a_quiet_pool_wakes_for_its_idle_unload_and_a_failure_backoff() -> None:
    idle = replace(POLICY, idle_unload_ms={"coder": 60_000})
    resident_coder = snap(resident="coder", committed_ms=NOW - 20_000, released_ms=NOW - 50_000)
    assert rest_for_ms(resident_coder, idle, ME) == 40_000
    cold_backing_off = snap(resident=None, failures={"chat": 3_000}, parked=False)
    assert rest_for_ms(cold_backing_off, POLICY, ME) == 3_000
    relearning = snap(relearn_ms=NOW + 2_500)
    assert rest_for_ms(relearning, POLICY, ME) == 2_500


_MEMBER = st.sampled_from(["chat", "coder"])


@st.composite
def _states(draw: st.DrawFn) -> PoolSnapshot:
    leases = draw(st.dictionaries(_MEMBER, st.integers(0, 2)))
    waiters = draw(st.dictionaries(_MEMBER, st.integers(0, 2)))
    future = st.integers(NOW + 1, NOW + 20_000)
    return snap(
        phase=draw(st.sampled_from([Phase.IDLE, Phase.IDLE, *Phase])),
        resident=draw(st.sampled_from([None, "chat", "coder"])),
        target=draw(st.sampled_from([None, "chat", "coder"])),
        leases=leases,
        lease_expiry={m: draw(future) for m, n in leases.items() if n > 0},
        waiters=waiters,
        waiter_deadline={m: draw(future) for m, n in waiters.items() if n > 0},
        urgency={m: draw(st.integers(NOW - 60_000, NOW)) for m, n in waiters.items() if n > 0},
        failures=draw(st.dictionaries(_MEMBER, st.integers(1, 9_000))),
        committed_ms=draw(st.integers(NOW - 100_000, NOW)),
        released_ms=draw(st.integers(0, NOW)),
        heartbeat_ms=draw(st.integers(NOW - 5_000, NOW + 5_000)),
        relearn_ms=draw(st.sampled_from([0, NOW + 2_000])),
        unhealthy=draw(st.sampled_from([False, False, True])),
        closed=draw(st.sampled_from([False, False, True])),
        parked=draw(st.booleans()),
    )


@settings(max_examples=2000, deadline=None)
@given(
    state=_states(),
    idle_unload=st.sampled_from([None, 1_000, 60_000]),
    max_wait=st.sampled_from([None, 30_000]),
)
def test_a_rest_means_the_tick_would_decide_nothing_until_then(
    state: PoolSnapshot, idle_unload: int | None, max_wait: int | None
) -> None:
    policy = replace(
        POLICY,
        idle_unload_ms={"coder": idle_unload} if idle_unload else {},
        max_wait_ms=max_wait,
    )
    rest = rest_for_ms(state, policy, ME)
    if rest is None:
        return
    all_busy = dict.fromkeys(policy.members, True)
    for slots in (None, all_idle(policy), all_busy):
        read = {} if slots is None else {"slots_busy": slots}
        assert decide_tick(state, policy, ME, **read) is NOTHING
    if rest > 1:
        # Just before the moment it named (or much later, when it named none), with every
        # count as read (nothing expires before that moment), a tick has nothing to do.
        step = 3_600_000 if math.isinf(rest) else int(rest) - 1
        later = replace(state, now_ms=state.now_ms + step)
        for slots in (all_idle(policy), all_busy):
            assert decide_tick(later, policy, ME, slots_busy=slots) is NOTHING, (step, later)
