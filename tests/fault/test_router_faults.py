"""Fault tests: routers that die, freeze or stall, and clients that leave (guarantees 1, 2,
15 and 16 of docs/reliability.md)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.fault.conftest import MakeFaultStack, StartProxy
from tests.support.clients import chat, live_stream, stream_chat
from tests.support.faultproxy import UP, seen
from tests.support.faultstack import FaultStack
from tests.support.procs import freeze, frozen, kill, thaw
from tests.support.stack import pool_stack_config
from tests.support.waiting import eventually

pytestmark = pytest.mark.fault


def started(stack: FaultStack, routers: int = 1) -> FaultStack:
    stack.start_sims()
    stack.start_controller("c1")
    for _ in range(routers):
        stack.start_router()
    return stack


async def leases(stack: FaultStack, member: str) -> int:
    return int((await stack.pool())["leases"][member])


async def waiters(stack: FaultStack, member: str) -> int:
    return int((await stack.pool())["waiters"][member])


async def no_leases(stack: FaultStack, member: str) -> bool:
    return await leases(stack, member) == 0


async def no_waiters(stack: FaultStack, member: str) -> bool:
    return await waiters(stack, member) == 0


async def test_killed_router_lease_is_reaped_and_the_held_swap_proceeds(
    make_stack: MakeFaultStack,
) -> None:
    """A router SIGKILLed mid-stream: its lease is never renewed again and is reaped at its
    expiry (lease_expired is audited), and the swap held behind it then proceeds. (How
    long after the kill: bench/fault_timings.py.)"""
    stack = started(make_stack(pool_stack_config(pool={"leaseTtl": "2s"})))
    doomed = stack.start_router()
    await stack.wait_resident("judge")
    async with live_stream(doomed.url, "judge", max_tokens=400):  # 20 s: only the kill ends it
        held = asyncio.create_task(chat(stack.routers[0].url, "coder"))
        await eventually(lambda: waiters(stack, "coder"))
        live = await stack.lease_expiries("judge")
        kill(doomed)
        expiry, gone_at = await stack.wait_leases_gone("judge", seen=live)
        response = await held
    assert gone_at >= expiry, "the dead router's lease was removed before it expired"
    assert response.status_code == 200, response.text
    assert response.headers["x-hotseat-backend"] == "coder"
    [expired] = [e for e in await stack.settled_audit() if e["outcome"] == "lease_expired"]
    assert expired["member"] == "judge", expired
    # judge was unloaded for coder only once its lease had expired (the store's clock and
    # the sims' are the machine's). The audit events' own times do not tell: the reaper
    # stamps lease_expired after the removal, and the swap can start in between.
    [unload] = [e for e in await stack.ledger() if e.event == "unload_start"]
    assert unload.member == "judge", unload
    assert unload.time * 1000 >= expiry, (unload, expiry)
    await stack.assert_invariants()


async def test_router_frozen_past_its_lease_cannot_use_it_after_a_swap(
    make_stack: MakeFaultStack,
) -> None:
    """A router frozen (SIGSTOP) mid-stream for longer than leaseTtl, resumed after the pool
    swapped away: its stream ends with an error event (never a clean end), its old lease
    stays dead, and no request ever reached a member that was not resident."""
    stack = started(make_stack(pool_stack_config(pool={"leaseTtl": "1s"})), routers=2)
    sleeper, other = stack.routers
    await stack.wait_resident("judge")
    async with live_stream(sleeper.url, "judge", max_tokens=400, request_id="frozen-1") as stream:
        with frozen(sleeper):
            await stack.wait_audit(lambda e: e["outcome"] == "lease_expired")
            response = await chat(other.url, "coder")
            assert response.status_code == 200, response.text
            assert response.headers["x-hotseat-backend"] == "coder"
        result = await asyncio.wait_for(stream, 10)
    assert not result.done, result
    assert result.error is not None or result.broken is not None, result
    assert await leases(stack, "judge") == 0
    after = await chat(sleeper.url, "judge")
    assert after.status_code == 200, after.text
    assert after.headers["x-hotseat-backend"] == "judge"
    # The frozen router's stream was cut by the swap its expired lease allowed: the one
    # excuse the verdict knows, counted apart.
    verdict = await stack.assert_invariants(excused={"frozen-1"})
    assert verdict.summary()["excused"] == 1, verdict.summary()


async def test_router_frozen_between_grant_and_dispatch_does_not_dispatch_on_it(
    make_stack: MakeFaultStack, proxies: StartProxy
) -> None:
    """A router frozen right after its acquire left (the grant waits in its socket) until
    the lease expired and the pool swapped away: on resuming it does not dispatch on the
    dead lease; the request is served after a fresh activation and no request reached a
    member that was not resident."""
    config = pool_stack_config(pool={"leaseTtl": "1s"}, coder={"loadSeconds": 0.3})
    stack = started(make_stack(config))
    nats_port = int(stack.nats_url.rsplit(":", 1)[1])
    proxy = proxies(nats_port)
    sleeper = stack.start_router(nats_url=proxy.url("nats"))
    await stack.wait_resident("judge")
    asked = proxy.when_seen(b".pool.acquire", UP, lambda: freeze(sleeper), hold=False)
    request = asyncio.create_task(chat(sleeper.url, "judge", request_id="sleepy"))
    try:
        await seen(asked, 10)
        await stack.wait_audit(lambda e: e["outcome"] == "lease_expired", timeout=10)
        response = await chat(stack.routers[0].url, "coder")
        assert response.headers["x-hotseat-backend"] == "coder"
    finally:
        thaw(sleeper)
    answer = await request
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-hotseat-backend"] == "judge"
    await stack.assert_invariants()


async def test_client_leaving_mid_stream_releases_the_lease_at_once(
    make_stack: MakeFaultStack,
) -> None:
    """A client that disconnects mid-stream: the lease is released at once (gone while its
    30 s TTL is still running, so released, not reaped) and the upstream request is
    cancelled (the sim records a disconnect)."""
    stack = started(make_stack(pool_stack_config(pool={"leaseTtl": "30s"})))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    async with live_stream(url, "judge", max_tokens=400, request_id="gone-1"):
        live = await stack.lease_expiries("judge")
        assert len(live) == 1, live
    expiry, gone_at = await stack.wait_leases_gone("judge", seen=live, timeout=20)
    assert gone_at < expiry, "the lease lived until it expired"

    await eventually(lambda: stack.upstream_ended("gone-1", "disconnected"), timeout=20)
    events = await stack.settled_audit()
    assert [e["outcome"] for e in events if e.get("request_id") == "gone-1"] == [
        "client_disconnected"
    ]
    await stack.assert_invariants()


async def test_client_leaving_while_held_leaves_the_queue_at_once(
    make_stack: MakeFaultStack,
) -> None:
    """A client that disconnects while held: its request leaves the pool's queue at once
    (before its 60 s hold deadline), the pending swap is cancelled, and the incumbent's
    stream is untouched."""
    stack = started(make_stack(pool_stack_config(pool={"leaseTtl": "30s", "swapBudget": "60s"})))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    async with live_stream(url, "judge", max_tokens=60) as stream:
        held = asyncio.create_task(chat(url, "coder"))
        await eventually(lambda: waiters(stack, "coder"))
        [deadline] = (await stack.waiter_deadlines("coder")).values()
        held.cancel()
        await eventually(lambda: no_waiters(stack, "coder"), timeout=20, interval=0.02)
        assert await stack.store_now_ms() < deadline, "the waiter stayed until its deadline"
        await stack.wait_audit(lambda e: e["outcome"] == "swap_cancelled")
        result = await stream
    assert result.clean, result
    assert (await stack.pool())["resident"] == "judge"
    assert [
        e for e in await stack.ledger() if e.event == "load_start" and e.member == "coder"
    ] == []
    await stack.assert_invariants()


async def test_stalled_router_ends_an_unleased_stream_with_an_error_event(
    make_stack: MakeFaultStack,
) -> None:
    """A router whose event loop stalls past its lease (SIGSTOP longer than leaseTtl, the
    lease reaped meanwhile): on resuming, the stream ends with a lease_lost error event
    instead of continuing unleased."""
    stack = started(make_stack(pool_stack_config(pool={"leaseTtl": "1s"})))
    router = stack.routers[0]
    await stack.wait_resident("judge")
    async with httpx.AsyncClient(timeout=60) as client:
        first = asyncio.Event()
        stream = asyncio.create_task(
            stream_chat(client, router.url, "judge", 400, first=first, request_id="stall-1")
        )
        await asyncio.wait_for(first.wait(), 10)
        with frozen(router):
            await stack.wait_audit(lambda e: e["outcome"] == "lease_expired")
        result = await asyncio.wait_for(stream, 10)
    assert not result.done, result
    assert result.error is not None, result
    assert result.error["code"] == "lease_lost", result
    await stack.wait_audit(
        lambda e: e.get("request_id") == "stall-1" and e.get("reason") == "lease_lost"
    )
    await stack.assert_invariants()
