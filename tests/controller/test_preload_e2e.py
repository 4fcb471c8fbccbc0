"""Preload end to end (docs/adr/0008): a capacity pool's ``preload`` member is loaded as a
controller starts, beside the pinned one; unlike a pinned member it is evicted for demand
and not loaded again until a controller starts. Real sims, controllers and a router on
real NATS and Redis; the ledger's verdict at the end (never over capacity, nothing cut)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from hotseat.status_cli import format_pools
from hotseat_common.messages import PoolView
from tests.controller.test_capacity_e2e import capacity_config, chat, started, wait_residents
from tests.support.stack import Stack
from tests.support.waiting import eventually

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


async def _view(stack: Stack, controller: str, **expected: Any) -> dict[str, Any] | None:
    """The pool as ``controller`` shows it (``GET /v1/pools/gpu0``); ``None`` until every
    field of ``expected`` has its value there."""
    async with httpx.AsyncClient(timeout=5) as client:
        url = f"{stack.controllers[controller].url}/v1/pools/gpu0"
        view: dict[str, Any] = (await client.get(url)).json()
    return None if any(view.get(f) != v for f, v in expected.items()) else view


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
    by each controller. The pool view (and ``hotseat status``) of the controller that
    preloaded a flags it among the residents while it stays, and lists it as still to
    preload while its load runs (held by the test)."""
    stack = started(make_stack(preload_config()))
    url = stack.routers[0].url
    await wait_residents(stack, {"p", "a"})
    assert preloads(await stack.settled_audit()) == [("a", "c1")]
    state = await eventually(lambda: _view(stack, "c1", preload_pending=[]))
    assert state["preloaded"] == ["a"]  # the pool view flags it; `hotseat status` too
    assert format_pools([PoolView.model_validate(state)]).splitlines()[1].split()[1] == (
        "a[preload],p"
    )

    assert (await chat(url, "big")).status_code == 200
    await wait_residents(stack, {"p", "big"})
    assert (await _view(stack, "c1"))["preloaded"] == []  # evicted: no longer a preload
    await stack.wait_audit(lambda e: e.get("reason") == "idle_unload", timeout=30)
    await wait_residents(stack, {"p"})
    assert (await _view(stack, "c1"))["preload_pending"] == []  # only a start preloads

    await stack.hold_sim("a", "loading")
    stack.start_controller("c2")
    # While c2's preload of a loads, c2 shows a still to preload, not yet preloaded.
    loading = await eventually(lambda: _view(stack, "c2", phase="loading", swapping="a"))
    assert (loading["preload_pending"], loading["preloaded"]) == (["a"], [])
    await stack.hold_sim("a")
    await wait_residents(stack, {"p", "a"})
    assert (await eventually(lambda: _view(stack, "c2", preload_pending=[])))["preloaded"] == ["a"]
    assert (await _view(stack, "c1"))["preloaded"] == []  # c2 preloaded it, not c1
    events = await stack.settled_audit()
    assert preloads(events) == [("a", "c1"), ("a", "c2")]
    evicting = [e for e in events if e["outcome"] == "swap_started" and e.get("evicts")]
    assert [(e["reason"], e.get("to_member"), e["evicts"]) for e in evicting] == [
        ("evict_idle", "big", "a"),
        ("idle_unload", None, "big"),
    ]
    await stack.assert_invariants()
