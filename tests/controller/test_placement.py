"""Fleet placement as pure decisions (docs/adr/0012), no I/O: one request for a model
group placed on one pool from the group index."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hotseat_common.config.model import PoolActivation
from hotseat_common.messages import PlacementReason
from hotseat_pool_controller.decisions.placement import (
    CopyState,
    GroupMember,
    GroupPolicy,
    GroupSnapshot,
    copy_state,
    decide_placement,
)
from hotseat_pool_controller.model import Phase, PoolSnapshot
from tests.controller.test_capacity import POLICY as CAPACITY_POLICY

NOW = 1_000_000
STALE = 15_000
WAIT = PoolActivation.WAIT
IF_IDLE = PoolActivation.IF_IDLE
POOLS = ("gpu0", "gpu1", "gpu2", "gpu3")


def group(slots: int = 4, max_copies: int = 1) -> GroupPolicy:
    return GroupPolicy(
        name="assistant",
        max_copies=max_copies,
        members=tuple(GroupMember(p, "assistant", f"{p}-assistant", slots) for p in POOLS),
    )


RESIDENT = CopyState(resident=True, at_ms=NOW)
LOADING = CopyState(loading=True, at_ms=NOW)
COLD = CopyState(placeable=True, at_ms=NOW)
BUSY = CopyState(wait_s=10.0, at_ms=NOW)


def index(
    copies: dict[str, CopyState],
    *,
    leases: dict[str, int] | None = None,
    waiting: dict[str, int] | None = None,
    claims: dict[str, int] | None = None,
    session: str | None = None,
    busy: dict[str, int] | None = None,
) -> GroupSnapshot:
    return GroupSnapshot(
        now_ms=NOW,
        copies=copies,
        leases=leases or {},
        waiting=waiting or {},
        claims=claims or {},
        session_pool=session,
        busy=busy or {},
    )


def place(snap: GroupSnapshot, mode: PoolActivation = WAIT, **kw: object):  # type: ignore[no-untyped-def]
    return decide_placement(kw.pop("group", group()), snap, mode=mode, stale_ms=STALE, **kw)  # type: ignore[arg-type]


def test_requests_go_to_the_resident_copy_with_the_fewest_leases() -> None:
    """Three warm copies: the one serving least gets the request, whatever the order."""
    snap = index(
        {"gpu0": RESIDENT, "gpu1": RESIDENT, "gpu2": RESIDENT, "gpu3": COLD},
        leases={"gpu0": 2, "gpu1": 1, "gpu2": 3},
    )
    placement = place(snap)
    assert (placement.pool, placement.reason) == ("gpu1", PlacementReason.RESIDENT_LEAST_BUSY)
    assert not placement.claim


def test_spreading_fills_copies_evenly() -> None:
    """Placing one request at a time (each adds a lease) fills the warm copies in turn."""
    copies = {"gpu0": RESIDENT, "gpu1": RESIDENT, "gpu2": COLD, "gpu3": COLD}
    leases = {"gpu0": 0, "gpu1": 0}
    for _ in range(6):
        pool = place(index(copies, leases=leases)).pool
        assert pool is not None
        leases[pool] += 1
    assert leases == {"gpu0": 3, "gpu1": 3}


def test_a_cold_model_loads_where_eviction_is_cheapest() -> None:
    """No copy anywhere: the pool whose eviction costs least, then the longest unused."""
    snap = index({
        "gpu0": CopyState(placeable=True, cost_s=9, at_ms=NOW),
        "gpu1": CopyState(placeable=True, cost_s=2, unused_ms=NOW - 10, at_ms=NOW),
        "gpu2": CopyState(placeable=True, cost_s=2, unused_ms=NOW - 50_000, at_ms=NOW),
        "gpu3": BUSY,
    })  # fmt: skip
    placement = place(snap)
    assert (placement.pool, placement.reason, placement.claim) == (
        "gpu2",
        PlacementReason.COLD_CHEAPEST_EVICTION,
        True,
    )


def test_a_load_evicting_copies_beyond_demand_goes_before_a_cheaper_sole_copy() -> None:
    """A load that evicts only copies beyond demand (or nothing) goes before one that
    evicts a sole copy, however cheap; among equals, the cheapest eviction."""
    snap = index({
        "gpu0": CopyState(placeable=True, cost_s=0, sole=True, at_ms=NOW),
        "gpu1": CopyState(placeable=True, cost_s=9, at_ms=NOW),
        "gpu2": CopyState(placeable=True, cost_s=4, at_ms=NOW),
    })  # fmt: skip
    assert place(snap).pool == "gpu2"
    one = pool(resident="other", committed_ms=0, member_swap_times={"other": (0.2,)}, used={})
    assert copy_state(one, ONE, "assistant").sole
    assert not copy_state(one, ONE, "assistant", surplus={"other"}).sole


def test_concurrent_cold_demand_joins_the_claimed_copy() -> None:
    """Once one placement claimed a load, the next ones join it (single flight)."""
    copies = dict.fromkeys(POOLS, COLD)
    first = place(index(copies))
    assert first.claim
    assert first.pool is not None
    claims = {first.pool: NOW + 60_000}
    for waiting in range(3):
        later = place(index(copies, claims=claims, waiting={first.pool: waiting}))
        assert (later.pool, later.reason, later.claim) == (
            first.pool,
            PlacementReason.JOINS_LOADING_COPY,
            False,
        )


def test_demand_beyond_one_copys_slots_starts_a_second_copy() -> None:
    """With maxCopies 2, the loading copy's waiters reaching its slots start another."""
    copies = {"gpu0": LOADING, "gpu1": COLD, "gpu2": COLD, "gpu3": BUSY}
    two = group(slots=4, max_copies=2)
    joins = place(index(copies, waiting={"gpu0": 3}), group=two)
    # The join is made in the store's script that counts the waiter against the slots.
    assert (joins.pool, joins.join) == ("gpu0", ("gpu0",))
    second = place(index(copies, waiting={"gpu0": 4}), group=two)
    assert (second.pool, second.reason, second.claim) == ("gpu1", PlacementReason.SECOND_COPY, True)
    # maxCopies 1: the request queues on the one copy instead.
    one = place(index(copies, waiting={"gpu0": 4}), group=group(slots=4, max_copies=1))
    assert (one.pool, one.reason) == ("gpu0", PlacementReason.JOINS_LOADING_COPY)
    assert one.join == (), "no copy left to claim: it queues beyond the slots"


def test_full_resident_copies_start_another_only_below_max_copies() -> None:
    """Every resident copy full: a second copy if allowed, else the least busy copy."""
    copies = {"gpu0": RESIDENT, "gpu1": COLD, "gpu2": COLD, "gpu3": COLD}
    full = {"gpu0": 4}
    assert place(index(copies, leases=full), group=group(max_copies=2)).reason == (
        PlacementReason.SECOND_COPY
    )
    placement = place(index(copies, leases=full), group=group(max_copies=1))
    assert (placement.pool, placement.reason) == ("gpu0", PlacementReason.RESIDENT_LEAST_BUSY)


def test_if_idle_falls_through_only_when_every_pool_is_busy() -> None:
    """IfIdle: busy only with no copy and no pool to load one; Wait holds on the
    shortest expected wait."""
    busy = {
        "gpu0": replace(BUSY, wait_s=30.0),
        "gpu1": replace(BUSY, wait_s=5.0),
        "gpu2": replace(BUSY, wait_s=9.0),
        "gpu3": replace(BUSY, wait_s=5.0),
    }
    assert place(index(busy), IF_IDLE) == decide_placement(
        group(), index(busy), mode=IF_IDLE, stale_ms=STALE
    )
    assert place(index(busy), IF_IDLE).reason == PlacementReason.BUSY
    assert place(index(busy), IF_IDLE).pool is None
    held = place(index(busy, waiting={"gpu1": 2}), WAIT)
    assert (held.pool, held.reason) == ("gpu3", PlacementReason.BUSY_SHORTEST_WAIT)
    for pool, state in (("gpu2", COLD), ("gpu2", RESIDENT), ("gpu2", LOADING)):
        assert place(index({**busy, pool: state}), IF_IDLE).pool == pool
    # An entry written while gpu2's resident was idle, which has a lease since (counted
    # by the grant, no tick in between): gpu2 cannot load it now.
    leased = index({**busy, "gpu2": COLD}, busy={"gpu2": 1})
    assert place(leased, IF_IDLE).reason == PlacementReason.BUSY
    assert place(index({**busy, "gpu2": COLD}, busy={"gpu2": 0}), IF_IDLE).pool == "gpu2"


def test_a_lost_or_failed_pool_receives_no_placement() -> None:
    """An entry no controller refreshed within the stale bound, or a member in its
    failure backoff, is not a candidate; with none left the group has no pool."""
    stale = replace(RESIDENT, at_ms=NOW - STALE - 1)
    snap = index({"gpu0": stale, "gpu1": replace(COLD, failed=True), "gpu2": BUSY, "gpu3": BUSY})
    assert place(snap).pool in {"gpu2", "gpu3"}
    assert place(snap).reason == PlacementReason.BUSY_SHORTEST_WAIT
    gone = index({"gpu0": stale, "gpu1": replace(RESIDENT, failed=True)})
    assert place(gone) == place(gone, IF_IDLE)
    assert place(gone).reason == PlacementReason.NO_POOL


def test_a_pool_the_router_avoids_receives_no_placement() -> None:
    """The asking router quarantined gpu0's backend: the next copy takes the request,
    and with only gpu0 left, nothing is placed (the walk moves on)."""
    snap = index({"gpu0": RESIDENT, "gpu1": RESIDENT})
    assert place(snap).pool == "gpu0"
    assert place(snap, avoid=("gpu0",)).pool == "gpu1"
    lonely = index({"gpu0": RESIDENT})
    assert place(lonely, avoid=("gpu0",)).reason == PlacementReason.NO_POOL


def test_session_affinity_never_costs_a_wait() -> None:
    """The session's copy when it has a free slot; when it is full another warm copy
    with room takes the request instead."""
    copies = {"gpu0": RESIDENT, "gpu1": RESIDENT, "gpu2": COLD, "gpu3": COLD}
    warm = place(index(copies, leases={"gpu0": 1, "gpu1": 3}, session="gpu1"))
    assert (warm.pool, warm.reason) == ("gpu1", PlacementReason.SESSION_AFFINITY)
    full = place(index(copies, leases={"gpu0": 1, "gpu1": 4}, session="gpu1"))
    assert (full.pool, full.reason) == ("gpu0", PlacementReason.RESIDENT_LEAST_BUSY)
    gone = place(index(copies, leases={"gpu0": 1, "gpu1": 2}, session="gpu2"))
    assert gone.pool == "gpu0"


def test_a_held_request_keeps_its_pool_unless_a_warm_copy_has_room() -> None:
    """Asking again, a held request stays where it waits; a copy that turned warm with
    a free slot elsewhere takes it instead."""
    copies = {"gpu0": LOADING, "gpu1": BUSY, "gpu2": BUSY, "gpu3": BUSY}
    assert place(index(copies), placed="gpu1").reason == PlacementReason.KEPT
    warm = {**copies, "gpu0": RESIDENT}
    assert place(index(warm), placed="gpu1").pool == "gpu0"
    lost = {**copies, "gpu1": replace(BUSY, at_ms=0)}
    assert place(index(lost), placed="gpu1").pool == "gpu0"


COPY = st.builds(
    CopyState,
    resident=st.booleans(),
    loading=st.booleans(),
    placeable=st.booleans(),
    cost_s=st.integers(0, 20),
    unused_ms=st.integers(0, NOW),
    wait_s=st.floats(0, 100),
    failed=st.booleans(),
    at_ms=st.sampled_from([NOW, NOW - STALE - 1]),
)


@given(
    copies=st.dictionaries(st.sampled_from(POOLS), COPY),
    leases=st.dictionaries(st.sampled_from(POOLS), st.integers(0, 8)),
    waiting=st.dictionaries(st.sampled_from(POOLS), st.integers(0, 8)),
    busy=st.dictionaries(st.sampled_from(POOLS), st.integers(0, 2)),
    max_copies=st.integers(1, 4),
    mode=st.sampled_from([WAIT, IF_IDLE]),
)
def test_every_placement_keeps_the_rules(
    copies: dict[str, CopyState],
    *,
    leases: dict[str, int],
    waiting: dict[str, int],
    busy: dict[str, int],
    max_copies: int,
    mode: PoolActivation,
) -> None:
    """Whatever the index: the pool placed on is live; a resident copy with a free slot
    is never passed over for a load or a wait; a load is claimed only below maxCopies on
    a placeable pool whose resident has no lease; IfIdle is told busy only when no live
    copy serves or can load."""
    g = group(max_copies=max_copies)
    snap = index(copies, leases=leases, waiting=waiting, busy=busy)
    placement = decide_placement(g, snap, mode=mode, stale_ms=STALE)
    live = {p: c for p, c in copies.items() if c.at_ms == NOW and not c.failed}
    if placement.pool is not None:
        assert placement.pool in live
    free_warm = [p for p, c in live.items() if c.resident and leases.get(p, 0) < 4]
    if free_warm:
        assert placement.pool in free_warm
    if placement.claim:
        copies_now = sum(1 for c in live.values() if c.resident or c.loading)
        assert copies_now < max_copies
        assert placement.pool is not None
        assert live[placement.pool].placeable
        assert not busy.get(placement.pool)
    if placement.take:
        # A resident copy is chosen: the take chooses again among live resident copies
        # only (with a free slot, unless every one is full), the read's choice among them.
        assert placement.pool in placement.take
        assert all(live[p].resident for p in placement.take if p in live)
        assert set(placement.take) <= set(live)
        if placement.room:
            assert set(placement.take) == set(free_warm)
    elif placement.reason in {
        PlacementReason.RESIDENT_LEAST_BUSY,
        PlacementReason.SESSION_AFFINITY,
    }:
        raise AssertionError(f"a resident copy chosen without a take: {placement}")
    if placement.reason == PlacementReason.BUSY:
        assert mode == IF_IDLE
        assert not any(
            c.resident or c.loading or (c.placeable and not busy.get(p)) for p, c in live.items()
        )


# --- one pool's entry, from its snapshot ------------------------------------------------

SET = replace(CAPACITY_POLICY, capacity_gib=24.0, memory_gib={"assistant": 6.0, "coder": 20.0})
ONE = replace(SET, capacity_gib=None, memory_gib={})


def pool(**fields: object) -> PoolSnapshot:
    base: dict[str, object] = {"now_ms": NOW, "phase": Phase.IDLE, "epoch": 7, "version": 3}
    base.update(fields)
    return PoolSnapshot(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("snap", "expected"),
    [
        (pool(), CopyState(placeable=True, at_ms=NOW)),
        (pool(resident="assistant", committed_ms=0), CopyState(resident=True, at_ms=NOW)),
        (
            pool(resident="assistant", committed_ms=0, unhealthy=True),
            CopyState(failed=True, at_ms=NOW),
        ),
        (
            pool(resident="coder", committed_ms=0, member_swap_times={"coder": (4.2,)}, used={}),
            CopyState(placeable=True, cost_s=5, at_ms=NOW, sole=True),
        ),
        (
            # Its leases are counted in the group index by its grants (GroupSnapshot.busy)
            pool(resident="coder", committed_ms=0, leases={"coder": 1}, used={}),
            CopyState(placeable=True, at_ms=NOW, sole=True),
        ),
        (
            pool(resident="coder", committed_ms=0, relearn_ms=NOW + 1000),
            CopyState(at_ms=NOW),
        ),
        (
            pool(phase=Phase.LOADING, target="assistant", started_ms=NOW),
            CopyState(loading=True, at_ms=NOW),
        ),
        (pool(failures={"assistant": 3000}), CopyState(failed=True, at_ms=NOW)),
    ],
    ids=[
        "cold",
        "resident",
        "unhealthy",
        "idle-incumbent",
        "leased-incumbent",
        "relearning-incumbent",
        "loading",
        "failed",
    ],
)
def test_copy_state_of_a_one_resident_pool(snap: PoolSnapshot, expected: CopyState) -> None:
    """The entry says what a placement needs: warm, loading, loadable and at what cost."""
    assert copy_state(snap, ONE, "assistant") == expected


def test_copy_state_of_a_capacity_pool() -> None:
    """A member that fits is loadable for free; one that needs a busy member gone is not;
    one that needs an idle member gone costs that member's reload."""
    fits = pool(residents=frozenset({"coder"}), resident="coder")
    assert copy_state(fits, SET, "assistant").placeable  # 6 + 20 > 24: coder evicted, idle
    assert copy_state(fits, SET, "assistant").cost_s == 0
    busy = replace(fits, leases={"coder": 1})
    assert not copy_state(busy, SET, "assistant").placeable
    measured = replace(fits, member_swap_times={"coder": (7.5,)})
    assert copy_state(measured, SET, "assistant").cost_s == 8
    warm = pool(residents=frozenset({"assistant"}))
    assert copy_state(warm, SET, "assistant").resident
    unwell = replace(warm, unwell=frozenset({"assistant"}))
    assert copy_state(unwell, SET, "assistant") == CopyState(failed=True, at_ms=NOW)
    assert place(index({"gpu0": copy_state(unwell, SET, "assistant"), "gpu1": COLD})) == (
        place(index({"gpu1": COLD}))
    )
