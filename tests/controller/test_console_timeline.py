"""The console's residency timeline from audit events (pure: events in, timeline out) and
its live feed of the pools (one reader for every watcher)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from hotseat_common.messages import PoolList, PoolView
from hotseat_pool_controller.console.feed import PoolFeed
from hotseat_pool_controller.console.timeline import build_timeline

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SINCE = T0 - timedelta(minutes=10)
UNTIL = T0 + timedelta(minutes=10)


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def view(resident: str | None = "coder", **fields: Any) -> PoolView:
    return PoolView.model_validate(
        {
            "name": "gpu0",
            "resident": resident,
            "swapping": None,
            "phase": "idle",
            "epoch": 7,
            "leases": {"judge": 0, "coder": 0},
            "waiters": {"judge": 0, "coder": 0},
            **fields,
        }
    )


def pool_event(outcome: str, seconds: float, **fields: Any) -> dict[str, Any]:
    return {"kind": "pool", "outcome": outcome, "time": at(seconds), "pool": "gpu0", **fields}


def request(
    request_id: str, start: float, end: float, member: str, **fields: Any
) -> dict[str, Any]:
    return {
        "kind": "request",
        "outcome": "served",
        "time": at(end),
        "duration_ms": (end - start) * 1000,
        "request_id": request_id,
        "rule": "r",
        "pool": "gpu0",
        "member": member,
        **fields,
    }


def test_swaps_pair_by_epoch_and_residency_follows_them() -> None:
    """judge warmed, then swapped out for coder: two spans, two swaps; the requests that
    spanned coder's arrival are its waiters, the earliest its cause; the others are not."""
    events = [
        pool_event("swap_started", 0, epoch=1, to_member="judge", reason="warm_default"),
        pool_event("swap_completed", 1, epoch=1, to_member="judge", duration_ms=1000.0),
        pool_event(
            "swap_started", 60, epoch=2, from_member="judge", to_member="coder", reason="demand"
        ),
        pool_event("swap_completed", 68, epoch=2, from_member="judge", to_member="coder"),
    ]
    requests = [
        request("early", 59.5, 70, "coder"),
        request("later", 61, 72, "coder"),
        request("after", 69, 71, "coder"),  # came once coder was resident: waited for nothing
        request("judge-one", 30, 31, "judge"),
    ]
    timeline = build_timeline(view(), events, requests, since=SINCE, until=UNTIL)
    assert [(s.member, s.start, s.end) for s in timeline.residency] == [
        ("judge", T0 + timedelta(seconds=1), T0 + timedelta(seconds=60)),
        ("coder", T0 + timedelta(seconds=68), UNTIL),
    ]
    warm, demand = timeline.swaps
    assert (warm.outcome, warm.reason, warm.waiters_total, warm.cause) == (
        "swap_completed",
        "warm_default",
        0,
        None,
    )
    assert demand.outcome == "swap_completed"
    assert demand.duration_ms == 8000.0, "measured from its start when the event has none"
    assert [w.request_id for w in demand.waiters] == ["early", "later"]
    assert demand.cause is not None
    assert demand.cause.request_id == "early"


def test_a_swap_id_decides_which_swap_a_request_waited_for_and_names_its_cause() -> None:
    """Events that carry a swap id pair by it; a request with one belongs to that swap
    whatever its times say; the cause is the request ``swap_started`` names."""
    events = [
        pool_event(
            "swap_started",
            10,
            epoch=5,
            swap_id="s-1",
            from_member="judge",
            to_member="coder",
            reason="demand",
            request_id="second",
        ),
        pool_event(
            "swap_failed",
            15,
            epoch=5,
            swap_id="s-1",
            to_member="coder",
            reason="load failed",
            unload_ms=1000.0,
            load_ms=4000.0,
        ),
    ]
    requests = [
        request("first", 8, 15.5, "coder", outcome="pool_activation_timeout", swap_id="s-1"),
        request("second", 9, 15.5, "coder", outcome="pool_activation_timeout", swap_id="s-1"),
        request("other", 9, 15.5, "coder", swap_id="s-2"),
    ]
    timeline = build_timeline(view(None), events, requests, since=SINCE, until=UNTIL)
    (swap,) = timeline.swaps
    assert (swap.swap_id, swap.outcome) == ("s-1", "swap_failed")
    assert (swap.unload_ms, swap.load_ms) == (1000.0, 4000.0)
    assert [w.request_id for w in swap.waiters] == ["first", "second"]
    assert swap.cause_request_id == "second"
    assert swap.cause is not None
    assert swap.cause.request_id == "second", "the named cause, not the earliest waiter"
    assert [(s.member, s.before_window) for s in timeline.residency] == [("judge", True)]
    assert timeline.residency[0].end == T0 + timedelta(seconds=10)


def test_a_swap_in_flight_has_no_end_and_nothing_is_resident_after_its_start() -> None:
    events = [
        pool_event(
            "swap_started", 100, epoch=3, from_member="coder", to_member="judge", reason="demand"
        ),
    ]
    timeline = build_timeline(
        view(None, phase="loading", swapping="judge"), events, [], since=SINCE, until=UNTIL
    )
    (swap,) = timeline.swaps
    assert (swap.outcome, swap.ended) == ("in_flight", None)
    assert [(s.member, s.end) for s in timeline.residency] == [
        ("coder", T0 + timedelta(seconds=100))
    ]


def test_a_swap_begun_before_the_window_starts_with_it() -> None:
    """Its ``swap_started`` is older than the window: the bar starts at the window's start
    (its duration says it began earlier), and what follows is the target's residency."""
    events = [
        pool_event(
            "swap_completed",
            -598,
            epoch=9,
            from_member="judge",
            to_member="coder",
            duration_ms=4000.0,
        ),
    ]
    timeline = build_timeline(view(), events, [], since=SINCE, until=UNTIL)
    (swap,) = timeline.swaps
    assert (swap.started, swap.duration_ms) == (SINCE, 4000.0)
    assert [(s.member, s.start, s.before_window) for s in timeline.residency] == [
        ("coder", T0 - timedelta(seconds=598), False),
    ]


def test_a_quiet_window_shows_the_resident_throughout() -> None:
    timeline = build_timeline(view("judge"), [], [], since=SINCE, until=UNTIL)
    assert [(s.member, s.start, s.end, s.before_window) for s in timeline.residency] == [
        ("judge", SINCE, UNTIL, True)
    ]
    assert timeline.swaps == []


def test_a_lost_resident_ends_its_span() -> None:
    events = [pool_event("resident_lost", 5, member="judge", reason="health check failed")]
    timeline = build_timeline(view(None), events, [], since=SINCE, until=UNTIL)
    assert [(s.member, s.end) for s in timeline.residency] == [("judge", T0 + timedelta(seconds=5))]


def test_a_capacity_pools_residents_come_and_go_each_on_its_own() -> None:
    """In a capacity pool a member loads beside the residents: only the member a plan
    evicts leaves, and the residents no event named were there throughout."""
    events = [
        pool_event("swap_started", 20, epoch=4, swap_id="p-1", from_member="a",
                   to_member="c", reason="evict_idle"),
        pool_event("swap_completed", 23, epoch=4, swap_id="p-1", to_member="c"),
        pool_event("swap_started", 40, epoch=5, swap_id="p-2", to_member="a", reason="fits"),
        pool_event("swap_completed", 41, epoch=5, swap_id="p-2", to_member="a"),
    ]  # fmt: skip
    now = view(None, residents=["a", "b", "c"], capacity_gib=24.0, free_gib=2.0)
    timeline = build_timeline(now, events, [], since=SINCE, until=UNTIL)
    spans = {(s.member, s.start, s.end, s.before_window) for s in timeline.residency}
    assert spans == {
        ("a", SINCE, T0 + timedelta(seconds=20), True),
        ("b", SINCE, UNTIL, True),
        ("c", T0 + timedelta(seconds=23), UNTIL, False),
        ("a", T0 + timedelta(seconds=41), UNTIL, False),
    }
    assert [s.reason for s in timeline.swaps] == ["evict_idle", "fits"]


def test_a_plan_of_several_members_shows_each_of_them_and_ends_once() -> None:
    """A capacity pool's plan loads x with y and z at once (``also``); z fails alone (its
    own swap_failed, same swap id): the plan is one swap, ended by its own completion,
    after which x and y are resident and z is not."""
    events = [
        pool_event("swap_started", 20, epoch=4, swap_id="p-1", to_member="x", also="y,z",
                   reason="fits"),
        pool_event("swap_failed", 22, epoch=4, swap_id="p-1", to_member="z", reason="boom"),
        pool_event("swap_completed", 23, epoch=4, swap_id="p-1", to_member="x"),
    ]  # fmt: skip
    now = view(None, residents=["x", "y"], capacity_gib=24.0, free_gib=2.0)
    timeline = build_timeline(now, events, [], since=SINCE, until=UNTIL)
    assert [(s.swap_id, s.outcome) for s in timeline.swaps] == [("p-1", "swap_completed")]
    spans = {(s.member, s.start, s.end) for s in timeline.residency}
    assert spans == {
        ("x", T0 + timedelta(seconds=23), UNTIL),
        ("y", T0 + timedelta(seconds=23), UNTIL),
    }


async def test_the_feed_reads_once_for_every_watcher_and_sends_only_changes() -> None:
    """Two watchers get the pools at once, then only what changed; a read serves both;
    closing the feed ends both watches."""
    reads = 0
    current = view("judge")

    async def read() -> PoolList:
        nonlocal reads
        reads += 1
        return PoolList(pools=[current])

    feed = PoolFeed(read, interval=0.05, keepalive=0.2)
    runner = asyncio.create_task(feed.run())
    try:
        first, second = feed.watch(), feed.watch()
        got = [await anext(first), await anext(second)]
        assert all(g is not None and '"resident":"judge"' in g[1] for g in got)
        current = view("coder")
        feed.changed()
        changed = await anext(first)
        assert changed is not None
        assert changed[0] == "pools"
        assert '"resident":"coder"' in changed[1]
        assert (await anext(first)) is None, "nothing new: a keep-alive, not the same pools"
        again = await anext(second)
        assert again is not None
        assert '"resident":"coder"' in again[1]
        before = reads
        feed.close()
        assert [item async for item in first] == []
        assert [item async for item in second] == []
        assert reads >= before
    finally:
        runner.cancel()


async def test_the_feed_reports_a_store_it_cannot_read() -> None:
    async def read() -> PoolList:
        raise ConnectionError("store down")

    feed = PoolFeed(read, interval=0.05)
    runner = asyncio.create_task(feed.run())
    try:
        item = await anext(feed.watch())
        assert item == ("unavailable", '{"error": "store down"}')
    finally:
        feed.close()
        runner.cancel()
