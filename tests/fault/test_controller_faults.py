"""Fault tests: controllers killed mid-swap, racing each other, absent, or slow (guarantees
3, 4, 8 and 9 of docs/reliability.md)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis

from hotseat_common.keys import Keys
from tests.fault.conftest import MakeFaultStack, StartProxy
from tests.support.clients import chat, live_stream
from tests.support.faultproxy import DOWN, UP, seen
from tests.support.faultstack import FaultStack
from tests.support.stack import pool_stack_config
from tests.support.waiting import eventually

pytestmark = pytest.mark.fault

ROUNDS_PER_PHASE = 3
"""Kills per swap phase in the controller-kill test (3 phases: 9 kills, one to three
minutes)."""


def phases_config() -> dict[str, Any]:
    """Unloads and loads that the test holds in their phase (the sims' ``/control/hold``)
    while it kills a controller in it."""
    return pool_stack_config(
        pool={"leaseTtl": "2s", "swapBudget": "30s"},
        judge={"loadSeconds": 0.8, "unloadSeconds": 0.5, "tokensPerSecond": 50},
        coder={"loadSeconds": 0.8, "unloadSeconds": 0.5, "tokensPerSecond": 50},
    )


INCUMBENT_UNTIL_CANCELLED = 3000
"""max_tokens of an incumbent stream that outlasts the test (a minute at 50 tokens/s): the
test ends it by cancelling its client."""


async def _phase(stack: FaultStack, phase: str) -> dict[str, str] | None:
    state = await stack.state_hash()
    return state if state.get("phase") == phase else None


def _load_epochs(timeline: list[Any]) -> list[int]:
    return [int(e.fields["epoch"]) for e in timeline if e.event == "load_start"]


@pytest.mark.timeout(600)  # nine controller restarts: minutes on a loaded host
async def test_controller_killed_in_every_swap_phase_never_makes_two_residents(
    make_stack: MakeFaultStack,
) -> None:
    """Two replicas; the swap's owner (or, while draining, a replica) is SIGKILLed in each
    phase, draining, unloading and loading, round after round: never two residents, the
    pool converges on the requested member every time, and epochs strictly increase.
    Each phase lasts until the test ends it, so the kill lands in it however slowly the
    test gets there: draining until the incumbent's client leaves, unloading and loading
    until the sim's hold on them is lifted."""
    stack = make_stack(phases_config())
    stack.start_sims()
    stack.start_controller("c1")
    stack.start_controller("c2")
    stack.start_router()
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    epochs = [int((await stack.state_hash())["epoch"])]
    resident, other = "judge", "coder"
    rounds = [p for _ in range(ROUNDS_PER_PHASE) for p in ("draining", "unloading", "loading")]
    for i, phase in enumerate(rounds):
        async with contextlib.AsyncExitStack() as scope:
            if phase == "draining":  # the incumbent must be busy for the pool to drain
                incumbent = await scope.enter_async_context(
                    live_stream(url, resident, INCUMBENT_UNTIL_CANCELLED)
                )
            else:
                held_member = resident if phase == "unloading" else other
                await stack.hold_sim(held_member, phase)
            held = asyncio.create_task(chat(url, other))
            state = await eventually(lambda p=phase: _phase(stack, p), timeout=30, interval=0.02)
            victim = state.get("owner") or ("c1" if i % 2 else "c2")
            stack.controllers[victim].kill()
            restart = asyncio.create_task(asyncio.to_thread(stack.restart_controller, victim))
            if phase == "draining":
                assert not incumbent.done(), ("the incumbent ended while draining", phase)
                incumbent.cancel()  # its client leaves: the pool drains
            else:
                await stack.hold_sim(held_member)
            response = await held
            assert response.status_code == 200, (phase, response.text)
            assert response.headers["x-hotseat-backend"] == other, phase
            await restart
        await stack.wait_resident(other)
        epochs.append(int((await stack.state_hash())["epoch"]))
        resident, other = other, resident
    assert epochs == sorted(set(epochs)), f"epochs did not strictly increase: {epochs}"
    verdict = await stack.assert_invariants()
    timeline = await stack.ledger()
    loads = _load_epochs(timeline)
    assert loads == sorted(loads), f"a load ran with an older epoch than one before: {loads}"
    assert verdict.loads >= len(rounds)


async def test_racing_replicas_make_one_transition_at_a_time(
    make_stack: MakeFaultStack,
) -> None:
    """Two replicas and two routers under conflicting concurrent Wait demand for both
    members: every swap epoch is started by exactly one replica and completed at most
    once, the GPU never holds two members, and every client gets 200 or 503 with
    Retry-After."""
    stack = make_stack(
        pool_stack_config(
            pool={"leaseTtl": "2s", "swapBudget": "8s"},
            judge={"loadSeconds": 0.2, "tokensPerSecond": 100},
            coder={"loadSeconds": 0.3},
        )
    )
    stack.start_sims()
    stack.start_controller("c1")
    stack.start_controller("c2")
    stack.start_router()
    stack.start_router()
    await stack.wait_resident("judge")
    rng = random.Random(7)
    statuses: Counter[int] = Counter()
    bad: list[str] = []
    stop_at = time.monotonic() + 15

    async def client(n: int) -> None:
        while time.monotonic() < stop_at:
            router = stack.routers[rng.randrange(2)].url
            model = rng.choice(["judge", "coder"])
            response = await chat(router, model, max_tokens=rng.randint(1, 8), timeout=30)
            statuses[response.status_code] += 1
            if response.status_code == 503 and "retry-after" in response.headers:
                continue
            if response.status_code != 200:
                bad.append(f"client {n}: {response.status_code} {response.text}")
            await asyncio.sleep(rng.random() * 0.3)  # think time: the demand's shape, no wait

    await asyncio.gather(*(client(n) for n in range(8)))
    assert bad == [], bad
    assert statuses[200] > 0
    events = await stack.settled_audit()
    started = Counter(e["epoch"] for e in events if e["outcome"] == "swap_started")
    completed = Counter(e["epoch"] for e in events if e["outcome"] == "swap_completed")
    assert len(started) >= 3, f"too little contention to prove anything: {started}"
    assert all(n == 1 for n in started.values()), started
    assert all(n == 1 for n in completed.values()), completed
    assert set(completed) <= set(started)
    await stack.assert_invariants()


async def test_no_controller_fails_pooled_requests_at_once(make_stack: MakeFaultStack) -> None:
    """No controller is running: a pooled request gets 503 with Retry-After at once, on
    NATS's no-responders answer, never after waiting for a controller to reply (how fast:
    bench/fault_timings.py); the router stays ready."""
    stack = make_stack(pool_stack_config())
    stack.start_sims()
    router = stack.start_router()
    for _ in range(3):
        response = await chat(router.url, "judge")
        assert response.status_code == 503, response.text
        assert int(response.headers["retry-after"]) >= 1
        # NATS's no-responders answer; a question left unanswered would instead have been
        # asked again until the swap budget ran out (pool_activation_timeout).
        assert response.json()["error"]["code"] == "controller_unavailable", response.text
    async with httpx.AsyncClient(timeout=10) as client:
        assert (await client.get(f"{router.url}/readyz")).status_code == 200
    # Nothing reached the GPU: no load, no request (the verdict refuses an empty ledger as
    # no evidence; here an empty ledger is the claim).
    assert await stack.ledger() == []


async def _request_leases(stack: FaultStack, request_id: str) -> tuple[str | None, int]:
    """(the lease granted to the client request ``request_id``, live leases on judge)."""
    client: aioredis.Redis = aioredis.from_url(stack.redis_url, decode_responses=True)
    try:
        keys = Keys(stack.prefix)
        metas = await client.hgetall(keys.pool_lease_meta("gpu0"))
        mine = [
            lease for lease, meta in metas.items() if orjson.loads(meta)["request_id"] == request_id
        ]
        count = await client.zcard(keys.pool_leases("gpu0", "judge"))
        return (mine[0] if mine else None), int(count)
    finally:
        await client.aclose()


async def test_a_retried_acquire_gets_the_same_single_lease(
    make_stack: MakeFaultStack, proxies: StartProxy
) -> None:
    """The controller's reply is slower than the router's request timeout: the router asks
    again with the same request id and gets the lease granted to its first question; the
    pool never holds more than one lease for the request."""
    stack = make_stack(pool_stack_config(pool={"leaseTtl": "10s"}))
    nats_port = int(stack.nats_url.rsplit(":", 1)[1])
    proxy = proxies(nats_port)
    stack.start_sims()
    stack.start_controller("c1", nats_url=proxy.url("nats"))
    router = stack.start_router()
    await stack.wait_resident("judge")
    seen_leases: set[str] = set()
    most = 0

    async def watch() -> None:
        nonlocal most
        while True:
            lease, count = await _request_leases(stack, "slow-1")
            if lease:
                seen_leases.add(lease)
            most = max(most, count)
            await asyncio.sleep(0.02)  # sampling Redis: a second lease has no event of its own

    watcher = asyncio.create_task(watch())
    # Replies leave the controller 2.5 s late: longer than the router's 2 s per request.
    proxy.latency(2.5, UP)
    first = proxy.when_seen(b".pool.acquire", DOWN, hold=False)
    request = asyncio.create_task(chat(router.url, "judge", request_id="slow-1"))
    await seen(first, 10)
    second = proxy.when_seen(b".pool.acquire", DOWN, hold=False)
    await seen(second, 10)  # the router asked again, with the same request id
    proxy.pass_()
    response = await request
    watcher.cancel()
    assert response.status_code == 200, response.text
    assert response.headers["x-hotseat-backend"] == "judge"
    assert len(seen_leases) == 1, seen_leases
    assert most == 1
    await stack.assert_invariants()


async def _granted(stack: FaultStack, request_id: str) -> str | None:
    lease, _ = await _request_leases(stack, request_id)
    return lease


async def test_an_orphan_lease_expires(make_stack: MakeFaultStack, proxies: StartProxy) -> None:
    """The router gives up before the controller's grant reaches it and its cancel is lost
    too: the orphan lease is never renewed, it is reaped at its expiry (lease_expired), and
    the pool can swap again. (How soon after the grant: bench/fault_timings.py.)"""
    ttl = 2.0
    stack = make_stack(
        pool_stack_config(
            pool={"leaseTtl": f"{ttl}s", "swapBudget": "1s"}, coder={"loadSeconds": 0.2}
        )
    )
    nats_port = int(stack.nats_url.rsplit(":", 1)[1])
    proxy = proxies(nats_port)
    stack.start_sims()
    stack.start_controller("c1", nats_url=proxy.url("nats"))
    router = stack.start_router()
    second_router = stack.start_router()
    await stack.wait_resident("judge")
    proxy.blackhole(UP)  # no reply leaves the controller
    delivered = proxy.when_seen(b".pool.acquire", DOWN, hold=False)
    request = asyncio.create_task(chat(router.url, "judge", request_id="orphan-1"))
    await seen(delivered, 10)
    await eventually(lambda: _granted(stack, "orphan-1"), interval=0.02)
    granted = await stack.lease_expiries("judge")
    proxy.blackhole(DOWN)  # ... and nothing more reaches it: the router's cancel is lost
    response = await request
    assert response.status_code == 503, response.text
    assert "retry-after" in response.headers
    assert (await stack.lease_expiries("judge")).items() <= granted.items(), "renewed"
    expiry, gone_at = await stack.wait_leases_gone("judge", seen=granted)
    assert gone_at >= expiry, "the orphan lease was removed before it expired"
    assert not await _granted(stack, "orphan-1")
    proxy.pass_()
    # The pool can swap again: a request for coder starts the swap (its 1 s budget may run
    # out first on a busy machine), coder becomes resident, and is served.
    await chat(second_router.url, "coder")
    await stack.wait_resident("coder")
    swapped = await chat(second_router.url, "coder")
    assert swapped.status_code == 200, swapped.text
    assert swapped.headers["x-hotseat-backend"] == "coder"
    expired = [
        e
        for e in await stack.settled_audit()
        if e["outcome"] == "lease_expired" and e.get("request_id") == "orphan-1"
    ]
    assert len(expired) == 1, expired
    await stack.assert_invariants()
