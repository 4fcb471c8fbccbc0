"""The router's fallback paths that tests/router/test_activation.py drives with a scripted
activation client, end to end: real routers, controller, NATS, Redis and sims. A failed
swap moves the request to the route's next backend; a controller that is gone leaves the
pooled backends out and an unpooled one serves; a lease lost mid-stream ends the stream
with an error event and cuts the upstream request."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hotseat.launcher import free_port
from tests.fault.conftest import MakeFaultStack, StartProxy
from tests.support.clients import chat, live_stream
from tests.support.faultstack import FaultStack
from tests.support.stack import pool_stack_config
from tests.support.waiting import eventually

pytestmark = pytest.mark.fault


def paths_config(*, pool: dict[str, Any] | None = None, **members: Any) -> dict[str, Any]:
    """The shared pool plus ``plain``, an unpooled backend, and the routes under test."""
    plain = {"name": "plain", "address": f"http://127.0.0.1:{free_port()}"}
    config = pool_stack_config(pool=pool, extra_backends=[plain], **members)
    config["rules"] = [
        {
            "name": "coder-then-judge",
            "match": {"models": ["coder-then-judge"]},
            "route": {"backends": ["coder", "judge"], "poolActivation": "Wait"},
        },
        {
            "name": "judge-then-plain",
            "match": {"models": ["judge-then-plain"]},
            "route": {"backends": ["judge", "plain"]},
        },
        *config["rules"],
    ]
    return config


def started(stack: FaultStack) -> FaultStack:
    stack.start_sims()
    stack.start_controller("c1")
    stack.start_router()
    return stack


async def test_a_failed_swap_moves_the_request_to_the_next_backend(
    make_stack: MakeFaultStack,
) -> None:
    """coder's load (10 s) outlives the pool's swapTimeout (1.5 s): the swap fails, the
    router moves the request on to judge, which the pool loads again and which serves it."""
    stack = started(
        make_stack(
            paths_config(
                pool={"swapTimeout": "1.5s", "swapBudget": "30s"}, coder={"loadSeconds": 10}
            )
        )
    )
    await stack.wait_resident("judge")
    response = await chat(stack.routers[0].url, "coder-then-judge", request_id="failed-1")
    assert response.status_code == 200, response.text
    assert response.headers["x-hotseat-backend"] == "judge"
    events = await stack.settled_audit()
    pool = [(e["outcome"], e.get("to_member")) for e in events if e["kind"] == "pool"]
    # After the default's first load: coder's swap failed, then judge was loaded again.
    assert pool[2:] == [
        ("swap_started", "coder"),
        ("swap_failed", "coder"),
        ("swap_started", "judge"),
        ("swap_completed", "judge"),
    ], pool
    [request] = [e for e in events if e["kind"] == "request" and e["request_id"] == "failed-1"]
    assert (request["outcome"], request["backend"]) == ("served", "judge"), request
    await stack.assert_invariants()


async def test_a_controller_gone_leaves_an_unpooled_backend_to_serve(
    make_stack: MakeFaultStack,
) -> None:
    """The only controller is SIGKILLed: a route of [judge (pooled), plain] is served by
    plain without touching judge; a route of pooled backends only fails closed (503
    controller_unavailable with Retry-After)."""
    stack = started(make_stack(paths_config()))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    before = await chat(url, "judge-then-plain", request_id="with-controller")
    assert before.headers["x-hotseat-backend"] == "judge"
    stack.controllers["c1"].kill()
    response = await chat(url, "judge-then-plain", request_id="without-controller")
    assert response.status_code == 200, response.text
    assert response.headers["x-hotseat-backend"] == "plain"
    closed = await chat(url, "judge")
    assert closed.status_code == 503, closed.text
    assert closed.json()["error"]["code"] == "controller_unavailable"
    assert int(closed.headers["retry-after"]) >= 1
    served = {
        e.fields.get("request_id")
        for e in await stack.ledger()
        if e.event == "serve_start" and e.member == "judge"
    }
    assert "with-controller" in served
    assert "without-controller" not in served
    [event] = [
        e for e in await stack.settled_audit() if e.get("request_id") == "without-controller"
    ]
    assert (event["outcome"], event["backend"]) == ("served", "plain"), event
    await stack.assert_invariants()


async def test_a_lease_lost_mid_stream_ends_it_and_cuts_the_upstream(
    make_stack: MakeFaultStack, proxies: StartProxy
) -> None:
    """The router's NATS is cut off mid-stream: its renewals go unconfirmed, so once the
    lease's TTL has passed the stream ends with a lease_lost error event (never a clean
    end), the upstream request is cut (the sim records the disconnect), and the request
    event says served, lease_lost, once NATS is back."""
    stack = make_stack(paths_config(pool={"leaseTtl": "2s"}))
    proxy = proxies(int(stack.nats_url.rsplit(":", 1)[1]))
    stack.start_sims()
    stack.start_controller("c1")
    router = stack.start_router(nats_url=proxy.url("nats"))
    await stack.wait_resident("judge")
    async with live_stream(router.url, "judge", 400, request_id="lost-1") as stream:
        proxy.blackhole()  # 400 tokens at 20 tok/s: only the lost lease can end it early
        result = await asyncio.wait_for(stream, 30)
        proxy.pass_()
    assert not result.done, result
    assert result.error is not None, result
    assert result.error["code"] == "lease_lost", result

    await eventually(lambda: stack.upstream_ended("lost-1", "disconnected"), timeout=20)
    await eventually(lambda: _request_event(stack, "lost-1"), timeout=30)
    # (The controller may also have audited the lease's expiry: the router could not renew
    # it, nor release it, while cut off.)
    events = await stack.settled_audit()
    requests = [e for e in events if e["kind"] == "request" and e.get("request_id") == "lost-1"]
    assert len(requests) == 1, requests  # exactly one request event
    [event] = requests
    assert (event["outcome"], event["reason"]) == ("served", "lease_lost"), event
    await stack.assert_invariants()


async def _request_event(stack: FaultStack, request_id: str) -> bool:
    return any(e.get("request_id") == request_id for e in await stack.audit())
