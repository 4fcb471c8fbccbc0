"""Slots: at most ``slots`` generations at once, the rest queue; a client that leaves frees
its slot at once; tokens come at the member's pace."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from hotseat_common.keys import Keys
from hotseat_sim.timeline import LedgerEvent
from tests.sim.conftest import StartSim
from tests.support.sim import SimHandle, sim_pool_config, wait_for_timeline
from tests.support.waiting import eventually

CHAT = "/v1/chat/completions"


def ask(max_tokens: int, *, stream: bool = False) -> dict:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


async def slots_until(sim: SimHandle, busy: int, timeout: float = 20.0) -> list[dict]:
    """Poll /slots (the sim announces no slot change) until exactly ``busy`` are processing."""

    async def matching() -> list[dict] | None:
        slots = (await sim.http.get("/slots")).json()
        return slots if sum(s["is_processing"] for s in slots) == busy else None

    result: list[dict] = await eventually(matching, timeout=timeout, interval=0.005)
    return result


async def _in_flight(sim: SimHandle, count: int) -> bool:
    return bool((await sim.state())["in_flight"] == count)


async def test_slots_busy_during_a_request_and_idle_after(start_sim: StartSim) -> None:
    """/slots shows is_processing true while a request generates and false once it answered."""
    config = sim_pool_config({"a": {"tokensPerSecond": 100, "slots": 2}})
    sim = await start_sim(config, "a", loaded=True)
    idle = (await sim.http.get("/slots")).json()
    assert [s["id"] for s in idle] == [0, 1]
    assert not any(s["is_processing"] for s in idle)
    request = asyncio.create_task(sim.http.post(CHAT, json=ask(30)))
    busy = await slots_until(sim, 1)
    assert not request.done()
    assert busy[0]["is_processing"]
    assert busy[0]["next_token"]["n_remain"] > 0
    response = await request
    assert response.status_code == 200
    # The answer can reach the client a moment before the slot is freed behind it.
    after = await slots_until(sim, 0)
    assert [s["id"] for s in after] == [0, 1]


async def test_requests_beyond_slots_queue(start_sim: StartSim, redis, keys: Keys) -> None:
    """With one slot, a second request waits for the first to end before it starts."""
    config = sim_pool_config({"a": {"tokensPerSecond": 100, "slots": 1}})
    sim = await start_sim(config, "a", loaded=True)
    first = asyncio.create_task(
        sim.http.post(CHAT, json=ask(60), headers={"x-hotseat-request-id": "first"})
    )
    await slots_until(sim, 1)
    second = asyncio.create_task(
        sim.http.post(CHAT, json=ask(5), headers={"x-hotseat-request-id": "second"})
    )
    await eventually(lambda: _in_flight(sim, 2), timeout=20, interval=0.005)
    assert len([s for s in (await sim.http.get("/slots")).json() if s["is_processing"]]) == 1
    assert (await first).status_code == 200
    assert (await second).status_code == 200

    def serve_events(timeline):
        return [
            (e.event, e.fields.get("request_id"))
            for e in timeline
            if e.event in {LedgerEvent.SERVE_START, LedgerEvent.SERVE_END}
        ]

    timeline = await wait_for_timeline(redis, keys, "gpu0", lambda t: len(serve_events(t)) == 4)
    assert serve_events(timeline) == [
        (LedgerEvent.SERVE_START, "first"),
        (LedgerEvent.SERVE_END, "first"),
        (LedgerEvent.SERVE_START, "second"),
        (LedgerEvent.SERVE_END, "second"),
    ]


async def test_stream_disconnect_frees_the_slot(start_sim: StartSim, redis, keys: Keys) -> None:
    """A streaming client that goes away stops its generation and frees the slot promptly."""
    config = sim_pool_config({"a": {"tokensPerSecond": 50, "slots": 1}})
    sim = await start_sim(config, "a", loaded=True)
    async with (
        httpx.AsyncClient(base_url=sim.url, timeout=5) as client,
        client.stream(
            "POST", CHAT, json=ask(5000, stream=True), headers={"x-hotseat-request-id": "gone"}
        ) as response,
    ):
        lines = response.aiter_lines()  # kept referenced: a dropped iterator closes the stream
        async for line in lines:
            if line.startswith("data:") and '"content":"' in line and '"content":""' not in line:
                break
        busy = await slots_until(sim, 1)
        assert busy[0]["next_token"]["n_decoded"] >= 1
    # Freed by the disconnect, long before the 100 s the 5000 tokens would take.
    await slots_until(sim, 0)
    timeline = await wait_for_timeline(
        redis, keys, "gpu0", lambda t: any(e.event is LedgerEvent.SERVE_END for e in t)
    )
    end = next(e for e in timeline if e.event is LedgerEvent.SERVE_END)
    assert end.fields["request_id"] == "gone"
    assert end.fields["outcome"] == "disconnected"
    assert (await sim.state())["in_flight"] == 0


async def test_plain_request_disconnect_frees_the_slot(start_sim: StartSim) -> None:
    """A non-streaming client that times out and leaves frees its slot promptly."""
    config = sim_pool_config({"a": {"tokensPerSecond": 50, "slots": 1}})
    sim = await start_sim(config, "a", loaded=True)
    async with httpx.AsyncClient(base_url=sim.url, timeout=0.3) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post(CHAT, json=ask(5000))  # 100 s of tokens: only leaving ends it
    await slots_until(sim, 0)
    assert (await sim.state())["in_flight"] == 0


async def test_tokens_come_at_the_members_pace(start_sim: StartSim) -> None:
    """max_tokens=20 at tokensPerSecond=100 takes at least 0.2 s, streamed or not (no
    upper bound: a loaded machine only makes it slower)."""
    config = sim_pool_config({"a": {"tokensPerSecond": 100}})
    sim = await start_sim(config, "a", loaded=True)
    started = time.monotonic()
    await sim.http.post(CHAT, json=ask(20))
    plain = time.monotonic() - started
    started = time.monotonic()
    async with sim.http.stream("POST", CHAT, json=ask(20, stream=True)) as response:
        stamps = [time.monotonic() async for line in response.aiter_lines() if line]
    streamed = time.monotonic() - started
    assert plain >= 0.2
    assert streamed >= 0.2
    assert stamps[-1] - stamps[0] >= 0.15  # tokens spread over time, not sent at once
