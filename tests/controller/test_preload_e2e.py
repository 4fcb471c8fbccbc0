"""Preload end to end (docs/adr/0008): a capacity pool's ``preload`` member is loaded as a
controller starts, beside the pinned one; unlike a pinned member it is evicted for demand
and not loaded again until a controller starts. Real sims, controllers and a router on
real NATS and Redis; the ledger's verdict at the end (never over capacity, nothing cut)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.controller.test_capacity_e2e import capacity_config, chat, started, wait_residents
from tests.support.stack import Stack

Make = Callable[[dict[str, Any]], Stack]


def preload_config() -> dict[str, Any]:
    """24 GiB: p pinned (6), a preloaded (6), big (14) unloaded after 1 s idle: big needs
    a gone, and once big is unloaded a would fit again."""
    config = capacity_config({
        "p": {"memoryGiB": 6, "pinned": True},
        "a": {"memoryGiB": 6},
        "big": {"memoryGiB": 14},
    })  # fmt: skip
    members = config["pools"][0]["members"]
    members[1]["preload"] = True
    members[2]["idleUnloadAfter"] = "1s"
    return config


def preloads(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [
        (e["to_member"], e["controller"])
        for e in events
        if e["outcome"] == "swap_started" and e.get("reason") == "preload"
    ]


async def test_a_preload_member_is_loaded_at_start_evicted_and_loaded_at_the_next_start(
    make_stack: Make,
) -> None:
    """c1 starts: p (pinned) and a (preload) are resident. A request for big evicts a (a
    pinned p stays); big idle 1 s is unloaded, and a, which fits again, stays absent: only
    a controller's start preloads. c2 starts and preloads a. Two ``preload`` swaps, one
    by each controller."""
    stack = started(make_stack(preload_config()))
    url = stack.routers[0].url
    await wait_residents(stack, {"p", "a"})
    assert preloads(await stack.settled_audit()) == [("a", "c1")]

    assert (await chat(url, "big")).status_code == 200
    await wait_residents(stack, {"p", "big"})
    await stack.wait_audit(lambda e: e.get("reason") == "idle_unload", timeout=30)
    await wait_residents(stack, {"p"})

    stack.start_controller("c2")
    await wait_residents(stack, {"p", "a"})
    events = await stack.settled_audit()
    assert preloads(events) == [("a", "c1"), ("a", "c2")]
    evicting = [e for e in events if e["outcome"] == "swap_started" and e.get("evicts")]
    assert [(e["reason"], e.get("to_member"), e["evicts"]) for e in evicting] == [
        ("evict_idle", "big", "a"),
        ("idle_unload", None, "big"),
    ]
    await stack.assert_invariants()
