"""The activation contract end to end (issue "pool controller", must-show 1-11): real sim
backends, real controller and router processes, real NATS and Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx

from tests.support.audit_trail import event_time
from tests.support.stack import Stack, pool_stack_config
from tests.support.waiting import eventually

Make = Callable[[dict[str, Any]], Stack]


def body(model: str, max_tokens: int = 1, *, stream: bool = False) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


async def chat(url: str, model: str, max_tokens: int = 1, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=60) as client:
        return await client.post(
            f"{url}/v1/chat/completions", json=body(model, max_tokens), headers=headers
        )


@asynccontextmanager
async def streaming(
    url: str, model: str, max_tokens: int, *, request_id: str | None = None
) -> AsyncIterator[asyncio.Task[str]]:
    """A streaming request that has received its first chunk (its lease is live)."""
    first = asyncio.Event()
    headers = {"x-hotseat-request-id": request_id} if request_id else {}

    async def run() -> str:
        async with (
            httpx.AsyncClient(timeout=60) as client,
            client.stream(
                "POST",
                f"{url}/v1/chat/completions",
                json=body(model, max_tokens, stream=True),
                headers=headers,
            ) as response,
        ):
            assert response.status_code == 200, await response.aread()
            backend = response.headers.get("x-hotseat-backend", "direct")
            async for _chunk in response.aiter_bytes():
                first.set()
            return backend

    task = asyncio.create_task(run())
    waiter = asyncio.create_task(first.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiter.cancel()
        task.result()
    try:
        yield task
    finally:
        if not task.done():
            task.cancel()


def started(stack: Stack) -> Stack:
    stack.start_sims()
    stack.start_controller("c1")
    stack.start_router()
    return stack


def loads(timeline: list[Any], member: str) -> list[Any]:
    return [e for e in timeline if e.event == "load_start" and e.member == member]


async def test_if_idle_skips_a_busy_incumbent(make_stack: Make) -> None:
    """IfIdle: judge busy streaming, a [coder, judge] request is served by judge at once;
    coder is never loaded; one busy_skip event and the busy-skip counter moved."""
    stack = started(make_stack(pool_stack_config()))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    async with streaming(url, "judge", max_tokens=200) as stream:  # 10 s at 20 tok/s
        response = await chat(url, "either", **{"x-hotseat-request-id": "ifidle-1"})
        assert response.status_code == 200, response.text
        assert response.headers["x-hotseat-backend"] == "judge"
        # Held, it would have been answered only after the stream (and coder's load).
        assert not stream.done(), "answered after the incumbent's stream: not skipped"
    skips = [e for e in await stack.settled_audit() if e["outcome"] == "busy_skip"]
    assert [(e["request_id"], e["member"]) for e in skips] == [("ifidle-1", "coder")]
    labels = {"pool": "gpu0", "member": "coder"}
    assert await stack.metric(0, "hotseat_pool_busy_skips_total", labels) == 1
    assert loads(await stack.judged_ledger(), "coder") == []


async def test_wait_holds_until_the_incumbent_drains(make_stack: Make) -> None:
    """Wait: held until judge drains, then judge unloaded, coder loaded, served by coder."""
    stack = started(make_stack(pool_stack_config()))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    async with streaming(url, "judge", max_tokens=30) as stream:
        response = await chat(url, "either-wait")
        stream_done_at = time.time()
        assert stream.done(), "the held request finished before the incumbent drained"
        await stream
    assert response.status_code == 200, response.text
    assert response.headers["x-hotseat-backend"] == "coder"
    timeline = await stack.judged_ledger()
    coder_load = loads(timeline, "coder")
    assert len(coder_load) == 1
    assert coder_load[0].time <= stream_done_at
    judge_served = [e for e in timeline if e.event == "serve_end" and e.member == "judge"]
    assert max(e.time for e in judge_served) <= coder_load[0].time


async def test_swap_in_flight_is_waited_on_under_if_idle(make_stack: Make) -> None:
    """A swap already in flight is waited on in IfIdle mode too (no skip to judge)."""
    stack = started(make_stack(pool_stack_config()))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    first = asyncio.create_task(chat(url, "coder"))
    await eventually(lambda: _swapping(stack, "coder"))
    response = await chat(url, "either")
    assert response.status_code == 200, response.text
    assert response.headers["x-hotseat-backend"] == "coder"
    assert (await first).status_code == 200
    assert [e for e in await stack.settled_audit() if e["outcome"] == "busy_skip"] == []
    await stack.assert_invariants()


async def _swapping(stack: Stack, target: str) -> bool:
    return (await stack.pool())["swapping"] == target


async def test_swap_budget_shorter_than_the_load(make_stack: Make) -> None:
    """Budget < load: 503 + Retry-After, outcome pool_activation_timeout; the load still
    completes and the next request is served warm without a new swap."""
    stack = started(make_stack(pool_stack_config(pool={"swapBudget": "0.5s"})))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    response = await chat(url, "coder", **{"x-hotseat-request-id": "budget-1"})
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) >= 1
    assert response.json()["error"]["code"] == "pool_activation_timeout"
    await stack.wait_resident("coder")
    warm = await chat(url, "coder")
    assert warm.status_code == 200
    assert warm.headers["x-hotseat-backend"] == "coder"
    events = await stack.settled_audit()
    assert [
        e["outcome"] for e in events if e.get("request_id") == "budget-1" and e["kind"] == "request"
    ] == ["pool_activation_timeout"]
    started_swaps = [
        e for e in events if e["outcome"] == "swap_started" and e["to_member"] == "coder"
    ]
    assert len(started_swaps) == 1
    await stack.assert_invariants()


async def test_every_backend_busy_gives_503(make_stack: Make) -> None:
    """All backends busy-skipped: 503 + Retry-After, outcome pool_incumbent_busy, no load."""
    stack = started(make_stack(pool_stack_config()))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    async with streaming(url, "judge", max_tokens=200) as stream:  # 10 s: busy throughout
        response = await chat(url, "coder-ifidle", **{"x-hotseat-request-id": "busy-1"})
        assert not stream.done()
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) >= 1
    assert response.json()["error"]["code"] == "pool_incumbent_busy"
    events = await stack.settled_audit()
    assert [e["outcome"] for e in events if e.get("request_id") == "busy-1"] == [
        "busy_skip",
        "pool_incumbent_busy",
    ]
    assert [e for e in events if e["outcome"] == "swap_started" and e["to_member"] == "coder"] == []
    assert loads(await stack.judged_ledger(), "coder") == []


async def test_busy_is_fleet_wide(make_stack: Make) -> None:
    """Two routers: a stream through router 1 makes IfIdle on router 2 skip the busy pool."""
    stack = started(make_stack(pool_stack_config()))
    second = stack.start_router()
    await stack.wait_resident("judge")
    async with streaming(stack.routers[0].url, "judge", max_tokens=200) as stream:  # 10 s
        response = await chat(second.url, "either")
        assert not stream.done()
    assert response.status_code == 200
    assert response.headers["x-hotseat-backend"] == "judge"
    assert await stack.metric(1, "hotseat_pool_busy_skips_total", {"member": "coder"}) == 1
    events = await stack.settled_audit()
    assert [e for e in events if e["outcome"] == "swap_started" and e["to_member"] == "coder"] == []
    assert loads(await stack.judged_ledger(), "coder") == []


async def test_resident_requests_coalesce_while_another_waits(make_stack: Make) -> None:
    """Judge streaming, coder held: a new judge request is served on judge at once; coder
    swaps in only after judge drains."""
    stack = started(make_stack(pool_stack_config()))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    async with streaming(url, "judge", max_tokens=100) as stream:  # 5 s at 20 tok/s
        held = asyncio.create_task(chat(url, "coder"))
        await eventually(lambda: _waiters(stack, "coder"))
        quick = await chat(url, "judge")
        assert quick.headers["x-hotseat-backend"] == "judge"
        # Queued behind coder's swap it would have come after the stream and the load.
        assert not stream.done(), "the judge request waited for the incumbent to drain"
        assert not held.done()
        await stream
    response = await held
    assert response.headers["x-hotseat-backend"] == "coder"
    timeline = await stack.judged_ledger()
    coder_load = loads(timeline, "coder")[0]
    judge_served = [e for e in timeline if e.event == "serve_end" and e.member == "judge"]
    assert max(e.time for e in judge_served) <= coder_load.time


async def _waiters(stack: Stack, member: str) -> bool:
    return (await stack.pool())["waiters"][member] > 0


async def test_killed_router_lease_expires_and_the_swap_proceeds(make_stack: Make) -> None:
    """A router SIGKILLed mid-stream: its lease expires (lease_expired is audited), and
    the held swap proceeds: judge is unloaded once that lease has expired, not before."""
    stack = started(make_stack(pool_stack_config()))
    doomed = stack.start_router()
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    async with streaming(doomed.url, "judge", max_tokens=400):  # 20 s: only the kill ends it
        held = asyncio.create_task(chat(url, "coder"))
        await eventually(lambda: _waiters(stack, "coder"))
        live = await stack.lease_expiries("judge")
        doomed.kill()
        killed_at = time.time()
        expiry, _ = await stack.wait_leases_gone("judge", seen=live)
        response = await held
    assert response.status_code == 200, response.text
    assert response.headers["x-hotseat-backend"] == "coder"
    [expired] = [
        e
        for e in await stack.settled_audit()
        if e["outcome"] == "lease_expired" and e["member"] == "judge"
    ]
    assert event_time(expired) >= killed_at, expired
    # The swap waited for the dead router's lease to expire, not for its stream to end.
    [unload] = [e for e in await stack.judged_ledger() if e.event == "unload_start"]
    assert unload.member == "judge", unload
    assert unload.time * 1000 >= expiry, (unload, expiry)


async def test_controller_killed_mid_swap_is_taken_over(make_stack: Make) -> None:
    """Two controllers; the swap's owner SIGKILLed mid-swap: the other finishes it, the
    waiter is answered, no overlap, epochs increase."""
    stack = make_stack(pool_stack_config(coder={"loadSeconds": 2.0}))
    stack.start_sims()
    stack.start_controller("c1")
    stack.start_controller("c2")
    stack.start_router()
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    epoch_before = int((await stack.state_hash())["epoch"])
    held = asyncio.create_task(chat(url, "coder"))
    await eventually(lambda: _swapping(stack, "coder"))
    owner = (await stack.state_hash())["owner"]
    stack.controllers[owner].kill()
    response = await held
    assert response.status_code == 200, response.text
    assert response.headers["x-hotseat-backend"] == "coder"
    state = await stack.state_hash()
    assert state["resident"] == "coder"
    assert int(state["epoch"]) > epoch_before
    await stack.assert_invariants()


async def test_client_leaving_during_the_load_does_not_abort_it(make_stack: Make) -> None:
    """A client that leaves once the load has started: the load completes, and the next
    request is served warm without another swap."""
    stack = started(make_stack(pool_stack_config()))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    held = asyncio.create_task(chat(url, "coder"))
    await eventually(lambda: _loading(stack, "coder"))
    held.cancel()
    await stack.wait_resident("coder")
    warm = await chat(url, "coder")
    assert warm.headers["x-hotseat-backend"] == "coder"
    swaps = [e for e in await stack.settled_audit() if e["outcome"] == "swap_started"]
    assert [e["to_member"] for e in swaps] == ["judge", "coder"]
    await stack.assert_invariants()


async def _loading(stack: Stack, member: str) -> bool:
    timeline = await stack.ledger()
    return bool(loads(timeline, member))


async def test_client_leaving_while_draining_cancels_the_pending_swap(make_stack: Make) -> None:
    """A client that leaves while the incumbent still drains cancels the pending swap; the
    busy incumbent is never unloaded by the cancel."""
    stack = started(make_stack(pool_stack_config()))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    async with streaming(url, "judge", max_tokens=100) as stream:  # 5 s: still draining
        held = asyncio.create_task(chat(url, "coder"))
        await eventually(lambda: _waiters(stack, "coder"))
        held.cancel()
        await stack.wait_audit(lambda e: e["outcome"] == "swap_cancelled")
        assert not stream.done(), "the incumbent finished first: nothing was pending"
        assert await stream == "judge"
    pool = await stack.pool()
    assert pool["resident"] == "judge"
    timeline = await stack.ledger()
    assert [e for e in timeline if e.event == "unload_start" and e.member == "judge"] == []
    assert loads(timeline, "coder") == []
    await stack.assert_invariants()


async def test_resident_killed_out_of_band_is_recovered(make_stack: Make) -> None:
    """The resident's server crashes and its supervisor restarts it empty: the controller
    notices (resident_lost is audited) and the next request loads it again and is served."""
    stack = started(make_stack(pool_stack_config()))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    stack.sims["judge"].kill()
    stack.restart_sim("judge")
    await stack.wait_audit(lambda e: e["outcome"] == "resident_lost" and e["member"] == "judge")
    response = await chat(url, "judge")
    assert response.status_code == 200, response.text
    assert response.headers["x-hotseat-backend"] == "judge"
    await stack.assert_invariants()
