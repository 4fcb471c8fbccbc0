"""Swap ids end to end (real sims, controller, router, audit service, NATS and Redis): the
request that causes a swap and those that wait for it carry its id on their events, as
its ``swap_*`` events do; the pool view shows the id while the swap runs; and the audit
service answers the swap's whole story in one query."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

from hotseat.launcher import free_port, start_service
from tests.controller.test_activation_e2e import chat, started
from tests.support.stack import Stack, pool_stack_config
from tests.support.waiting import eventually

Make = Callable[[dict[str, Any]], Stack]


async def _swap_in_flight(stack: Stack) -> dict[str, Any] | None:
    pool = await stack.pool()
    return pool if pool["swap_id"] is not None else None


async def test_the_cause_and_the_waiters_of_a_swap_carry_its_id(make_stack: Make) -> None:
    """A request for coder starts the swap (its ``swap_started`` names it), two more wait
    through it; all three responses (``x-hotseat-swap-id``) and request events, and the
    swap's started and completed events, carry the id the pool view showed during the
    swap, with the unloading and loading times; a later request served by the resident
    carries none. ``GET /v1/swaps/{id}``
    of the audit service tells the same story."""
    stack = started(make_stack(pool_stack_config(coder={"loadSeconds": 2})))
    audit = start_service(
        "audit",
        "hotseat-audit",
        ["--dsn", f"sqlite:///{stack.workdir / 'audit.db'}"],
        port=free_port(),
        log_dir=stack.workdir,
        env=stack.env,
    )
    try:
        await stack.wait_resident("judge")
        url = stack.routers[0].url
        cause = asyncio.create_task(chat(url, "coder", **{"x-hotseat-request-id": "cause-1"}))
        during = await eventually(lambda: _swap_in_flight(stack), interval=0.02)
        swap_id = during["swap_id"]
        assert during["swapping"] == "coder"
        waiters = [
            asyncio.create_task(chat(url, "coder", **{"x-hotseat-request-id": f"waiter-{i}"}))
            for i in range(2)
        ]
        responses = await asyncio.gather(cause, *waiters)
        assert [r.status_code for r in responses] == [200, 200, 200]
        assert [r.headers.get("x-hotseat-swap-id") for r in responses] == [swap_id] * 3
        after = await chat(url, "coder", **{"x-hotseat-request-id": "after-1"})
        assert after.status_code == 200
        assert "x-hotseat-swap-id" not in after.headers
        assert (await stack.pool())["swap_id"] is None

        events = await stack.settled_audit()
        swap_events = [e for e in events if e["kind"] == "pool" and e.get("swap_id") == swap_id]
        assert [e["outcome"] for e in swap_events] == ["swap_started", "swap_completed"]
        started_event, completed = swap_events
        assert (started_event["request_id"], started_event["reason"]) == ("cause-1", "demand")
        assert completed["unload_ms"] >= 0
        assert completed["load_ms"] >= 2000  # the sim's loadSeconds
        requests = {e["request_id"]: e for e in events if e["kind"] == "request"}
        for request_id in ("cause-1", "waiter-0", "waiter-1"):
            event = requests[request_id]
            assert (event["pool"], event["member"], event.get("swap_id")) == (
                "gpu0",
                "coder",
                swap_id,
            ), event
        assert "swap_id" not in requests["after-1"]

        async def told() -> dict[str, Any] | None:
            async with httpx.AsyncClient(timeout=5) as client:
                response = await client.get(f"{audit.url}/v1/swaps/{swap_id}")
            body: dict[str, Any] = response.json()
            return body if response.status_code == 200 and len(body["waiters"]) == 3 else None

        report = await eventually(told, timeout=30, interval=0.2)
        assert report["cause"]["request_id"] == "cause-1"
        assert report["outcome"] == "swap_completed"
        assert {w["request_id"] for w in report["waiters"]} == {"cause-1", "waiter-0", "waiter-1"}
        assert report["phases"]["load_ms"] == completed["load_ms"]
    finally:
        audit.stop()
    await stack.assert_invariants()


async def test_a_request_that_timed_out_waiting_names_the_swap(make_stack: Make) -> None:
    """The swap budget runs out during coder's load: the request's
    ``pool_activation_timeout`` event names the pool, the member and the swap it waited
    for, the swap that goes on after it (``swap_completed``) carries the same id."""
    config = pool_stack_config(coder={"loadSeconds": 3}, pool={"swapBudget": "1s"})
    stack = started(make_stack(config))
    await stack.wait_resident("judge")
    response = await chat(stack.routers[0].url, "coder", **{"x-hotseat-request-id": "late-1"})
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "pool_activation_timeout"
    (completed,) = await stack.wait_audit(
        lambda e: e["outcome"] == "swap_completed" and e["to_member"] == "coder", timeout=30
    )
    trail = await stack.settled_audit()
    late = next(e for e in trail if e.get("request_id") == "late-1" and e["kind"] == "request")
    assert (late["outcome"], late["pool"], late["member"]) == (
        "pool_activation_timeout",
        "gpu0",
        "coder",
    )
    assert late["swap_id"] == completed["swap_id"]
    await stack.assert_invariants()
