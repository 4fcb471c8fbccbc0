"""When a pool's supervisor may sleep (docs/adr/0011): :func:`quiet_for_ms` as a pure
decision. A pool with any lease, waiter, swap, drain or doubt is never quiet; a quiet
pool sleeps no later than the first moment a tick would decide something by itself.
Property: whenever it says quiet, ``decide_tick`` decides nothing now."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from hotseat_common.config.model import BusySignal
from hotseat_pool_controller.decisions.busy import all_idle
from hotseat_pool_controller.decisions.tick import decide_tick, quiet_for_ms
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


def test_a_warm_default_with_nothing_going_on_sleeps_without_a_deadline() -> None:
    assert quiet_for_ms(snap(), POLICY, ME) == math.inf


def test_leases_waiters_swaps_drains_and_doubt_keep_the_pool_ticking() -> None:
    busy = [
        snap(leases={"chat": 1}),
        snap(waiters={"coder": 1}),
        snap(phase=Phase.LOADING, target="coder", heartbeat_ms=NOW + 1000),
        snap(phase=Phase.UNLOADING, target="coder", heartbeat_ms=NOW + 1000),
        snap(phase=Phase.DRAINING, target="coder"),
        snap(phase=Phase.UNKNOWN),
        snap(unhealthy=True),
        snap(closed=True),
        snap(resident=None),  # cold with a default: the tick warms it now
    ]
    for state in busy:
        assert quiet_for_ms(state, POLICY, ME) is None, state


def test_a_quiet_pool_wakes_for_its_idle_unload_and_a_failure_backoff() -> None:
    idle = replace(POLICY, idle_unload_ms={"coder": 60_000})
    resident_coder = snap(resident="coder", committed_ms=NOW - 20_000, released_ms=NOW - 50_000)
    assert quiet_for_ms(resident_coder, idle, ME) == 40_000
    cold_backing_off = snap(resident=None, failures={"chat": 3_000}, parked=False)
    assert quiet_for_ms(cold_backing_off, POLICY, ME) == 3_000
    relearning = snap(relearn_ms=NOW + 2_500)
    assert quiet_for_ms(relearning, POLICY, ME) == 2_500


_STATES = st.builds(
    snap,
    phase=st.sampled_from([Phase.IDLE, Phase.IDLE, *Phase]),
    resident=st.sampled_from([None, "chat", "coder"]),
    target=st.sampled_from([None, "chat", "coder"]),
    leases=st.dictionaries(st.sampled_from(["chat", "coder"]), st.integers(0, 2)),
    waiters=st.dictionaries(st.sampled_from(["chat", "coder"]), st.integers(0, 2)),
    failures=st.dictionaries(st.sampled_from(["chat", "coder"]), st.integers(1, 9_000)),
    committed_ms=st.integers(NOW - 100_000, NOW),
    released_ms=st.integers(0, NOW),
    heartbeat_ms=st.integers(NOW - 5_000, NOW + 5_000),
    unhealthy=st.sampled_from([False, False, True]),
    closed=st.sampled_from([False, False, True]),
    parked=st.booleans(),
)


@settings(max_examples=1000, deadline=None)
@given(state=_STATES, idle_unload=st.sampled_from([None, 1_000, 60_000]))
def test_quiet_means_the_tick_would_decide_nothing_until_then(
    state: PoolSnapshot, idle_unload: int | None
) -> None:
    policy = replace(POLICY, idle_unload_ms={"coder": idle_unload} if idle_unload else {})
    quiet = quiet_for_ms(state, policy, ME)
    if quiet is None:
        return
    assert decide_tick(state, policy, ME) is NOTHING
    assert decide_tick(state, policy, ME, slots_busy=all_idle(policy)) is NOTHING
    all_busy = dict.fromkeys(policy.members, True)
    assert decide_tick(state, policy, ME, slots_busy=all_busy) is NOTHING
    if quiet > 1:
        # Just before the moment it named (or much later, when it named none), a tick
        # still has nothing to do.
        step = 3_600_000 if math.isinf(quiet) else int(quiet) - 1
        later = replace(state, now_ms=state.now_ms + step)
        assert decide_tick(later, policy, ME, slots_busy=all_idle(policy)) is NOTHING
