"""The scheduler end to end (docs/adr/0006): real sims, controller and router processes on
real NATS and Redis. ``maxWait`` bounds a waiter behind a resident whose own demand never
stops, ``minResidency`` keeps a new resident, priorities and aging order the waiters,
admission from the measured estimate answers at once, an idle resident returns to the
default. Every test ends with the ledger's full verdict: nothing was cut."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import openai
import yaml

from hotseat.launcher import free_port, start_service
from hotseat_common.keys import Keys
from tests.support.clients import StreamResult, live_stream, stream_chat
from tests.support.stack import Stack, pool_stack_config
from tests.support.waiting import eventually

Make = Callable[[dict[str, Any]], Stack]

JUDGE_UNTIL_CANCELLED = 1200
"""max_tokens of a judge stream that outlasts any test (a minute at 20 tokens/s): the
test ends it by cancelling its client."""
CODER_UNTIL_CANCELLED = 12000
"""The same for coder (a minute at 200 tokens/s)."""


def body(model: str, max_tokens: int = 1) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
    }


async def chat(url: str, model: str, max_tokens: int = 1, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=90) as client:
        return await client.post(
            f"{url}/v1/chat/completions", json=body(model, max_tokens), headers=headers
        )


def started(stack: Stack) -> Stack:
    stack.start_sims()
    stack.start_controller("c1")
    stack.start_router()
    return stack


@contextlib.asynccontextmanager
async def endless_demand(url: str, model: str, *, tokens: int = 20) -> AsyncIterator[list[int]]:
    """Streaming requests for ``model`` of ``tokens`` tokens each (one second at judge's
    20 tokens/s) as a relay: the next is sent once the running one is halfway through,
    so while the member grants them it always has one in flight (an idle moment would
    rightly let a waiter's swap start) and never more than two; a request held is not
    relayed until it streams. Yields once the second is halfway; the statuses of those
    ended (0 for a stream cut before its end)."""
    statuses: list[int] = []
    established = asyncio.Event()
    client = httpx.AsyncClient(timeout=httpx.Timeout(90, read=90))
    running: set[asyncio.Task[StreamResult]] = set()

    def ended(task: asyncio.Task[StreamResult]) -> None:
        running.discard(task)
        if not task.cancelled():
            result = task.result()
            statuses.append(result.status if result.status != 200 or result.done else 0)

    async def relay() -> None:
        sent = 0
        while True:
            halfway = asyncio.Event()
            task = asyncio.create_task(stream_chat(client, url, model, tokens, halfway=halfway))
            running.add(task)
            task.add_done_callback(ended)
            sent += 1
            reached = asyncio.create_task(halfway.wait())
            await asyncio.wait({task, reached}, return_when=asyncio.FIRST_COMPLETED)
            reached.cancel()
            if sent >= 2 and halfway.is_set():
                established.set()

    relaying = asyncio.create_task(relay())
    try:
        await established.wait()
        yield statuses
    finally:
        relaying.cancel()
        for task in list(running):
            task.cancel()
        await asyncio.gather(relaying, *running, return_exceptions=True)
        await client.aclose()


async def swaps_started(stack: Stack) -> list[dict[str, Any]]:
    return [e for e in await stack.settled_audit() if e["outcome"] == "swap_started"]


async def test_without_max_wait_a_waiter_is_held_to_its_budget(make_stack: Make) -> None:
    """judge always has a request in flight: with sticky residency (no maxWait) a request
    for coder is held to its budget and answered 503 pool_activation_timeout, while new
    requests for judge are still granted. One judge stream outlasts the test, so that
    judge is never idle even when the short requests all end together on a loaded host
    (a gap would let coder swap in, rightly)."""
    stack = started(make_stack(pool_stack_config(pool={"swapBudget": "4s"})))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    async with (
        live_stream(url, "judge", JUDGE_UNTIL_CANCELLED) as busy,
        endless_demand(url, "judge") as statuses,
    ):
        held = await chat(url, "coder")
        assert not busy.done(), "judge's stream ended while coder waited"
    assert held.status_code == 503, held.text
    assert held.json()["error"]["code"] == "pool_activation_timeout"
    assert set(statuses) == {200}
    await stack.assert_invariants()


async def test_max_wait_bounds_a_waiter_behind_endless_demand(make_stack: Make) -> None:
    """The same endless demand with maxWait 1s: judge closes, drains, and coder serves the
    request; judge's own requests were held meanwhile (and served after the swap back),
    never cut. With a 15 s lease the router always has a proven lease on judge to share
    with the next request: the closure must stop that sharing, or judge never drains."""
    pool = {"maxWait": "1s", "minResidency": "0s", "leaseTtl": "15s"}
    stack = started(make_stack(pool_stack_config(pool=pool)))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    async with endless_demand(url, "judge") as statuses:
        served = await chat(url, "coder")
        assert served.status_code == 200, served.text
        assert served.headers["x-hotseat-backend"] == "coder"
        assert int(served.headers["x-hotseat-hold-ms"]) >= 1000  # it waited maxWait at least
        count = len(statuses)

        async def judge_serves_again() -> bool:
            return len(statuses) > count + 2

        await eventually(judge_serves_again, timeout=60)
    assert set(statuses) == {200}, statuses
    reasons = [(e["to_member"], e["reason"]) for e in await swaps_started(stack)]
    assert ("coder", "demand") in reasons
    assert ("judge", "swap_back") in reasons
    await stack.assert_invariants()


MAX_WAIT_MS = 4000
"""maxWait of the pools that close early by a measured drain."""


async def _judge_resident_max_wait(make_stack: Make, *, lease_ttl: str) -> tuple[Stack, str]:
    """A pool with maxWait 4s and no minResidency, judge resident; and the router's url."""
    pool = {"maxWait": "4s", "minResidency": "0s", "leaseTtl": lease_ttl}
    stack = started(make_stack(pool_stack_config(pool=pool)))
    await stack.wait_resident("judge")
    return stack, stack.routers[0].url


async def _coder_waiter_closes_judge(stack: Stack) -> tuple[float, int]:
    """A coder request was sent: when its waiter arrived and when judge was closed for
    it (ms, store clock; polled: no event carries the close's moment)."""
    urgency = Keys(stack.prefix).pool_waiter_urgency("gpu0", "coder")
    arrival: float = await eventually(lambda: _waited_ms(stack, urgency, 0), timeout=30)

    async def closed() -> int | None:
        state = await stack.state_hash()
        at = int(state.get("closedat") or 0)
        return at if state.get("closed") and at >= arrival else None

    closed_at: int = await eventually(closed, timeout=30)
    return arrival, closed_at


async def test_max_wait_closes_earlier_by_the_residents_measured_drain(make_stack: Make) -> None:
    """judge served one 4 s stream (80 tokens at 20 tokens/s) alone: its router's release
    tells the controller how long it ran. judge then serves endless 4 s streams (each
    sent when the last is halfway: a drain takes 2 to 4 s). A coder request behind it
    closes judge before its waiter has waited maxWait, by the longest of judge's measured
    request times and drains, so the drain ends near maxWait (without the estimate the
    close came at maxWait itself); that drain is then recorded too. The moments are read
    from the store (its clock): the coder waiter's arrival and the state's close moment.
    Nothing is cut."""
    stack, url = await _judge_resident_max_wait(make_stack, lease_ttl="15s")
    async with httpx.AsyncClient(timeout=60) as client:
        alone = await stream_chat(client, url, "judge", 80)
    assert alone.status == 200
    assert alone.done
    measured = await eventually(lambda: stack.request_times("judge"))
    assert await stack.drain_times("judge") == []
    async with endless_demand(url, "judge", tokens=80) as statuses:
        waiting = asyncio.create_task(chat(url, "coder"))
        arrival, closed_at = await _coder_waiter_closes_judge(stack)
        # What the estimate could have been at the close: every time kept by then (the
        # lists only grow here, far from the ten they keep).
        kept = await stack.request_times("judge") + await stack.drain_times("judge")
        response = await waiting
        assert response.status_code == 200, response.text
        assert response.headers["x-hotseat-backend"] == "coder"
        drains = await eventually(lambda: stack.drain_times("judge"))
    waited_at_close = closed_at - int(arrival)
    assert waited_at_close < MAX_WAIT_MS, (waited_at_close, measured)
    assert waited_at_close >= MAX_WAIT_MS - round(max(kept) * 1000) - 1, (waited_at_close, kept)
    assert len(drains) == 1
    assert set(statuses) == {200}, statuses
    await stack.assert_invariants()


async def test_a_resident_whose_lease_is_never_released_is_measured_by_its_renewals(
    make_stack: Make,
) -> None:
    """judge serves endless 2 s streams (40 tokens at 20 tokens/s, each sent when the last
    is halfway): its router shares one lease between them and never releases it. The
    renewals (every 1 s with a 3 s lease) carry how long the streams that ended ran, so
    judge's request times are measured although it was never released nor closed, and a
    coder request behind it closes judge before its waiter has waited maxWait (store
    clock). Nothing is cut."""
    stack, url = await _judge_resident_max_wait(make_stack, lease_ttl="3s")
    async with endless_demand(url, "judge", tokens=40) as statuses:
        measured = await eventually(lambda: stack.request_times("judge"), timeout=30)
        assert await stack.drain_times("judge") == []
        waiting = asyncio.create_task(chat(url, "coder"))
        arrival, closed_at = await _coder_waiter_closes_judge(stack)
        response = await waiting
        assert response.status_code == 200, response.text
    assert closed_at - int(arrival) < MAX_WAIT_MS, (closed_at - int(arrival), measured)
    assert set(statuses) == {200}, statuses
    await stack.assert_invariants()


async def test_min_residency_keeps_a_new_resident(make_stack: Make) -> None:
    """With minResidency 60s, a coder resident that is serving is not closed for a judge
    request, however long past maxWait it waits: coder's requests are granted at once
    meanwhile (the pool is not closed). coder serves one stream that outlasts the test
    throughout, so it is never idle (endless short requests leave gaps on a loaded host,
    and a gap lets judge's request swap coder out, as it should, ending the test early)."""
    config = pool_stack_config(pool={"maxWait": "0.2s", "minResidency": "60s", "swapBudget": "20s"})
    stack = started(make_stack(config))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    assert (await chat(url, "coder")).status_code == 200
    await stack.wait_resident("coder")
    async with live_stream(url, "coder", CODER_UNTIL_CANCELLED) as busy:
        waiting = asyncio.create_task(chat(url, "judge"))
        keys = Keys(stack.prefix)
        urgency = keys.pool_waiter_urgency("gpu0", "judge")
        judge_arrival = await eventually(lambda: _waited_ms(stack, urgency, 1000))
        state = await stack.state_hash()
        assert state.get("closed", "") == ""
        granted = await chat(url, "coder")
        assert granted.status_code == 200
        # Asked after judge's waiter, granted while it still waits: coder's request was
        # not held behind it (its hold is shorter than the time judge's waiter has waited).
        judge_waited_ms = await stack.store_now_ms() - judge_arrival
        assert int(granted.headers["x-hotseat-hold-ms"]) < judge_waited_ms
        assert not waiting.done()
        assert not busy.done(), "coder's stream ended while judge waited"
    response = await waiting  # served once coder's stream was cancelled
    assert response.status_code == 200
    await stack.assert_invariants()


async def test_a_waiter_in_line_during_the_swap_is_not_held_by_min_residency(
    make_stack: Make,
) -> None:
    """A judge request arrives while the pool swaps to coder (a 3 s load); once coder is
    resident its own demand never stops. minResidency is 60 s, maxWait 2 s: the judge
    waiter was in line before coder's commit, so its maxWait deadline wins over coder's
    dwell: coder closes, drains, and judge is served well within its 20 s budget (held
    by the dwell it would be answered 503 at the budget). coder's requests held by the
    close are served after the swap back; nothing is cut."""
    config = pool_stack_config(
        pool={"maxWait": "2s", "minResidency": "60s", "swapBudget": "20s"},
        coder={"loadSeconds": 3.0},
    )
    stack = started(make_stack(config))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    first_coder = asyncio.create_task(chat(url, "coder"))

    async def swapping_to_coder() -> bool:
        state = await stack.state_hash()
        return state.get("phase") in ("unloading", "loading") and state.get("target") == "coder"

    await eventually(swapping_to_coder)
    waiting = asyncio.create_task(chat(url, "judge"))
    urgency = Keys(stack.prefix).pool_waiter_urgency("gpu0", "judge")
    await eventually(lambda: _waited_ms(stack, urgency, 0))
    assert await swapping_to_coder(), "judge's waiter came after coder's commit: no test"
    # 200 tokens at 200 tokens/s: each relayed coder request runs 1 s.
    async with endless_demand(url, "coder", tokens=200) as statuses:
        response = await waiting
        assert response.status_code == 200, response.text
        assert response.headers["x-hotseat-backend"] == "judge"
    assert (await first_coder).status_code == 200
    assert set(statuses) == {200}, statuses
    reasons = [(e["to_member"], e["reason"]) for e in await swaps_started(stack)]
    assert ("judge", "swap_back") in reasons, reasons
    await stack.assert_invariants()


async def _waited_ms(stack: Stack, urgency_key: str, at_least: float) -> float | None:
    """The most urgent waiter in ``urgency_key`` has waited ``at_least`` ms (store clock):
    its arrival then (ms, store clock), else None."""
    scores = await stack._scores(urgency_key)
    if not scores:
        return None
    arrival = min(scores.values())
    return arrival if await stack.store_now_ms() - arrival >= at_least else None


def three_members(pool: dict[str, Any]) -> dict[str, Any]:
    """judge, coder and a third member, small; rules judge, coder and small, each allowing
    x-hotseat-priority up to 9."""
    config = pool_stack_config(pool=pool)
    port = free_port()
    config["backends"].append(
        {
            "name": "small",
            "address": f"http://127.0.0.1:{port}",
            "pool": {"name": "gpu0", "member": "small"},
        }
    )
    config["pools"][0]["members"].append(
        {"name": "small", "sim": {"loadSeconds": 0.3, "unloadSeconds": 0.1, "memoryGiB": 4}}
    )
    config["rules"] = [
        {
            "name": name,
            "match": {"models": [name]},
            "route": {"backends": [name]},
            "priorityHeader": {"allow": True, "max": 9},
        }
        for name in ("judge", "coder", "small")
    ]
    return config


async def _queued(stack: Stack, member: str, count: int = 1) -> bool:
    return (await stack.pool())["waiters"].get(member, 0) >= count


async def test_a_higher_priority_waiter_is_swapped_in_first(make_stack: Make) -> None:
    """judge streams; coder (priority 0) asks first, small (priority 5) later: once judge
    drains, small is loaded first, then coder."""
    stack = started(make_stack(three_members({})))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    async with live_stream(url, "judge", JUDGE_UNTIL_CANCELLED) as busy:
        low = asyncio.create_task(chat(url, "coder"))
        await eventually(lambda: _queued(stack, "coder"))
        high = asyncio.create_task(chat(url, "small", **{"x-hotseat-priority": "5"}))
        await eventually(lambda: _queued(stack, "small"))
        assert not busy.done(), "judge's stream ended before both waited"
        busy.cancel()  # judge drains now, with both waiting
    for task in (low, high):
        assert (await task).status_code == 200
    order = [e["to_member"] for e in await swaps_started(stack) if e["reason"] != "warm_default"]
    assert order[:2] == ["small", "coder"], order
    await stack.assert_invariants()


async def test_aging_lets_a_long_waiter_go_before_a_later_higher_priority(
    make_stack: Make,
) -> None:
    """With priorityAging 0.2s, coder's priority 0 request that has waited more than 5
    steps goes before small's priority 5 request that came later."""
    stack = started(make_stack(three_members({"priorityAging": "0.2s"})))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    async with live_stream(url, "judge", JUDGE_UNTIL_CANCELLED) as busy:
        low = asyncio.create_task(chat(url, "coder"))
        key = Keys(stack.prefix).pool_waiter_urgency("gpu0", "coder")
        await eventually(lambda: _waited_ms(stack, key, 6 * 200))
        high = asyncio.create_task(chat(url, "small", **{"x-hotseat-priority": "5"}))
        await eventually(lambda: _queued(stack, "small"))
        assert not busy.done(), "judge's stream ended before both waited"
        busy.cancel()  # judge drains now, with both waiting
    for task in (low, high):
        assert (await task).status_code == 200
    order = [e["to_member"] for e in await swaps_started(stack) if e["reason"] != "warm_default"]
    assert order[:2] == ["coder", "small"], order
    await stack.assert_invariants()


async def test_a_higher_priority_waiter_closes_a_new_resident_at_once(make_stack: Make) -> None:
    """coder has just become resident (minResidency 60s, maxWait 2s) and its own demand
    never stops; a judge request of priority 9 (90 s of virtual wait at 10 s a level)
    ranks as in line before coder's commit, so it closes coder at once, dwell or not:
    coder's new requests are held from then on, its running ones drain, judge is served
    (held by the dwell it would be answered 503 at its 20 s budget), then coder's held
    requests after the swap back. Nothing is cut."""
    pool = {"maxWait": "2s", "minResidency": "60s", "swapBudget": "20s"}
    stack = started(make_stack(three_members(pool)))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    assert (await chat(url, "coder")).status_code == 200
    await stack.wait_resident("coder")
    # 200 tokens at 200 tokens/s: each relayed coder request runs 1 s.
    async with endless_demand(url, "coder", tokens=200) as statuses:
        high = asyncio.create_task(chat(url, "judge", **{"x-hotseat-priority": "9"}))

        async def closed() -> bool:
            return (await stack.state_hash()).get("closed") == "1"

        await eventually(closed)
        response = await high
        assert response.status_code == 200, response.text
        assert response.headers["x-hotseat-backend"] == "judge"
    assert set(statuses) == {200}, statuses
    reasons = [(e["to_member"], e["reason"]) for e in await swaps_started(stack)]
    assert ("judge", "swap_back") in reasons, reasons
    await stack.assert_invariants()


async def test_a_higher_priority_waiter_that_came_during_a_load_goes_before_its_requests(
    make_stack: Make,
) -> None:
    """A swap for coder (priority 0) is loading (the test holds the sim's load) when
    small's priority 5 request arrives: a load that began finishes, but once coder is
    resident it closes at once (maxWait 2s, minResidency 0s) and admits not even the
    request it was loaded for: small is swapped in and served first, and coder's request,
    held, is served by the swap back, not by the first coder swap."""
    stack = started(make_stack(three_members({"maxWait": "2s", "minResidency": "0s"})))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    await stack.hold_sim("coder", "loading")
    low = asyncio.create_task(chat(url, "coder"))

    async def loading_coder() -> dict[str, str] | None:
        state = await stack.state_hash()
        return state if (state.get("phase"), state.get("target")) == ("loading", "coder") else None

    first = await eventually(loading_coder)
    high = asyncio.create_task(chat(url, "small", **{"x-hotseat-priority": "5"}))
    await eventually(lambda: _queued(stack, "small"))
    await stack.hold_sim("coder")  # coder's load ends
    served_high, served_low = await high, await low
    assert served_high.status_code == 200, served_high.text
    assert served_high.headers["x-hotseat-backend"] == "small"
    assert served_low.status_code == 200, served_low.text
    assert served_low.headers["x-hotseat-backend"] == "coder"
    assert served_low.headers["x-hotseat-swap-id"] != first["swap"]
    events = [e for e in await stack.settled_audit() if e["kind"] == "pool"]
    completed = [e["to_member"] for e in events if e["outcome"] == "swap_completed"]
    assert completed[-3:] == ["coder", "small", "coder"], completed
    await stack.assert_invariants()


async def _unloading_for(stack: Stack, target: str) -> dict[str, str] | None:
    state = await stack.state_hash()
    return state if (state.get("phase"), state.get("target")) == ("unloading", target) else None


async def test_a_swap_still_unloading_turns_to_a_higher_priority_waiter(
    make_stack: Make,
) -> None:
    """A swap for coder (priority 0) unloads judge, whose unload the test holds (the
    sim's /control/hold); small's priority 5 request arrives meanwhile. Once judge is
    gone the swap loads small instead (swap_retargeted from coder to small, same swap),
    small is served first, and coder's request, held all along, is served by the next
    swap."""
    stack = started(make_stack(three_members({})))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    await stack.hold_sim("judge", "unloading")
    low = asyncio.create_task(chat(url, "coder"))
    state = await eventually(lambda: _unloading_for(stack, "coder"))
    high = asyncio.create_task(chat(url, "small", **{"x-hotseat-priority": "5"}))
    await eventually(lambda: _queued(stack, "small"))
    await stack.hold_sim("judge")  # judge's unload ends: the load that begins now is small's
    served_high, served_low = await high, await low
    assert served_high.status_code == 200, served_high.text
    assert served_high.headers["x-hotseat-backend"] == "small"
    assert served_high.headers["x-hotseat-swap-id"] == state["swap"]
    assert served_low.status_code == 200, served_low.text
    assert served_low.headers["x-hotseat-backend"] == "coder"
    events = [e for e in await stack.settled_audit() if e["kind"] == "pool"]
    swap = [e for e in events if e.get("swap_id") == state["swap"]]
    assert [(e["outcome"], e["from_member"], e["to_member"]) for e in swap] == [
        ("swap_started", "judge", "coder"),
        ("swap_retargeted", "coder", "small"),
        ("swap_completed", "judge", "small"),
    ], swap
    assert swap[1]["reason"] == "more_urgent"
    async with httpx.AsyncClient(timeout=5) as client:
        metrics = (await client.get(f"{stack.controller_url}/metrics")).text
    counted = 'hotseat_pool_swap_retargets_total{from_target="coder",pool="gpu0",to_member="small"}'
    assert f"{counted} 1.0" in metrics.splitlines(), metrics
    completed = [e["to_member"] for e in events if e["outcome"] == "swap_completed"]
    assert completed[-2:] == ["small", "coder"], completed
    await stack.assert_invariants()


async def _waiting(stack: Stack, member: str) -> bool:
    return (await stack.pool())["waiters"].get(member, 0) > 0


async def test_a_request_that_cannot_be_served_in_time_is_answered_at_once(
    make_stack: Make,
) -> None:
    """coder's load (1.5 s, measured once) is longer than a second router's 1s swapBudget
    for the pool: a request for coder through it is answered 503 at once (reason
    eta_over_budget, Retry-After from the estimate), and no swap starts for it."""
    stack = started(make_stack(pool_stack_config()))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    assert (await chat(url, "coder")).status_code == 200  # measures coder's load
    assert (await chat(url, "judge")).status_code == 200
    await stack.wait_resident("judge")
    hurried = copy.deepcopy(stack.config)
    hurried["pools"][0]["swapBudget"] = "1s"
    path = stack.workdir / "hurried.yaml"
    path.write_text(yaml.safe_dump(hurried))
    router = start_service(
        "router-hurried",
        "hotseat-router",
        [],
        port=free_port(),
        log_dir=stack.workdir,
        env={**stack.env, "HOTSEAT_CONFIG": str(path)},
    )
    stack.routers.append(router)
    before = len(await swaps_started(stack))
    response = await chat(router.url, "coder", **{"x-hotseat-request-id": "too-late-1"})
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "pool_activation_timeout"
    assert int(response.headers["retry-after"]) >= 2
    events = await stack.settled_audit()
    (event,) = [e for e in events if e.get("request_id") == "too-late-1" and e["kind"] == "request"]
    assert (event["outcome"], event["reason"]) == ("pool_activation_timeout", "eta_over_budget")
    assert len([e for e in events if e["outcome"] == "swap_started"]) == before
    assert (await chat(url, "coder")).status_code == 200  # the first router's budget suffices
    await stack.assert_invariants()


async def test_an_idle_resident_returns_to_the_default(make_stack: Make) -> None:
    """coder idle for its idleUnloadAfter (1s): judge, the default, comes back (reason
    return_to_default)."""
    config = pool_stack_config()
    config["pools"][0]["members"][1]["idleUnloadAfter"] = "1s"
    stack = started(make_stack(config))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    assert (await chat(url, "coder")).status_code == 200
    await stack.wait_resident("judge", timeout=30)
    reasons = [(e["to_member"], e["reason"]) for e in await swaps_started(stack)]
    assert reasons[-1] == ("judge", "return_to_default"), reasons
    await stack.assert_invariants()


async def test_an_idle_resident_without_a_default_is_unloaded(make_stack: Make) -> None:
    """No default: a member idle for the pool's idleUnloadAfter is unloaded and the pool
    stays cold (reason idle_unload)."""
    config = pool_stack_config(pool={"idleUnloadAfter": "1s"})
    del config["pools"][0]["default"]
    stack = started(make_stack(config))
    url = stack.routers[0].url
    await stack.wait_pool_known()
    assert (await chat(url, "coder")).status_code == 200
    await stack.wait_resident(None, timeout=30)
    reasons = [e["reason"] for e in await swaps_started(stack)]
    assert reasons[-1] == "idle_unload", reasons
    await stack.assert_invariants()


def keep_alive_config() -> dict[str, Any]:
    """Rule coder-ka: coder only, Wait, holdKeepAlive 0.2s; the pool's budget is 4s."""
    config = pool_stack_config(pool={"swapBudget": "4s"})
    config["rules"].append(
        {
            "name": "coder-ka",
            "match": {"models": ["coder-ka"]},
            "route": {"backends": ["coder"]},
            "holdKeepAlive": "0.2s",
        }
    )
    return config


WAITING_FOR_CODER = ": hotseat waiting for coder, position 1"


async def held_stream_lines(
    url: str, busy: asyncio.Task[StreamResult], *, end_busy_after: int | None = None
) -> list[str]:
    """A raw streaming request for coder-ka held behind ``busy`` (a judge stream that runs
    until it is cancelled): its headers must arrive while ``busy`` runs. With
    ``end_busy_after``, ``busy`` is cancelled once that many waiting comments were read
    (the swap to coder goes on then), so every one of them came while held. Returns every
    line of its body."""
    lines: list[str] = []
    async with (
        httpx.AsyncClient(timeout=60) as client,
        client.stream(
            "POST",
            f"{url}/v1/chat/completions",
            json={**body("coder-ka", 3), "stream": True},
        ) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert not busy.done(), "headers came after the hold: nothing was sent early"
        async for line in response.aiter_lines():
            if not line:
                continue
            lines.append(line)
            waited = sum(seen.startswith(WAITING_FOR_CODER) for seen in lines)
            if waited == end_busy_after:
                busy.cancel()  # judge's client leaves: its lease ends, coder is loaded
    return lines


async def test_a_held_stream_gets_headers_and_keep_alive_comments(make_stack: Make) -> None:
    """holdKeepAlive: a streaming request held behind judge gets its 200 and SSE comments
    (place and estimate) while held, then comments naming coder and the swap it waited
    for, and coder's stream; the OpenAI SDK reads the same content as unheld; held past
    its budget, the stream ends with the OpenAI error event of pool_activation_timeout.
    judge stays busy until the test ends its stream, so each step is ordered by what the
    clients read, not by how long judge's request takes."""
    stack = started(make_stack(keep_alive_config()))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    async with live_stream(url, "judge", JUDGE_UNTIL_CANCELLED) as busy:
        lines = await held_stream_lines(url, busy, end_busy_after=2)
    comments = [line for line in lines if line.startswith(":")]
    waiting = [c for c in comments if c.startswith(WAITING_FOR_CODER)]
    assert len(waiting) >= 2, lines
    assert comments[-2] == ": hotseat backend coder", lines
    assert comments[-1].startswith(": hotseat swap gpu0-"), lines  # the swap it waited for
    data = [line for line in lines if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    assert lines.index(comments[-1]) < lines.index(data[0])

    # The SDK through the same held path reads exactly what an unheld request gets.
    assert (await chat(url, "judge")).status_code == 200
    await stack.wait_resident("judge")
    async with (
        openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as sdk,
        live_stream(url, "judge", JUDGE_UNTIL_CANCELLED) as busy,
    ):

        async def read(model: str) -> str:
            stream = await sdk.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                stream=True,
            )  # fmt: skip
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        held = asyncio.create_task(read("coder-ka"))
        await eventually(lambda: _waiting(stack, "coder"))
        busy.cancel()
        held_text = await held
        direct_text = await read("coder-ka")
    assert held_text == direct_text != ""

    # Held past the pool's 4 s budget (judge busy until the test ends it): the 200 stream
    # ends with an error.
    assert (await chat(url, "judge")).status_code == 200
    await stack.wait_resident("judge")
    async with live_stream(url, "judge", JUDGE_UNTIL_CANCELLED) as busy:
        lines = await held_stream_lines(url, busy)
        assert not busy.done()
    last = json.loads(lines[-1].removeprefix("data: "))
    assert last["error"]["code"] == "pool_activation_timeout", lines
    assert any(line.startswith(": hotseat waiting for coder") for line in lines)
    await stack.assert_invariants()
