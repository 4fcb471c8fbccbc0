"""The control API the controller's sim driver uses: load/unload lifecycle, /health codes,
idempotence, epoch fencing, and an unload that drops in-flight requests."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from hotseat_common.keys import Keys
from hotseat_sim.timeline import LedgerEvent
from tests.sim.conftest import StartSim
from tests.support.sim import sim_pool_config, wait_for_timeline

LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


@pytest.fixture
def config():
    return sim_pool_config(
        {"a": {"loadSeconds": 0.3, "unloadSeconds": 0.2, "tokensPerSecond": 50, "memoryGiB": 6}}
    )


@pytest.fixture
def slow_load():
    """A load long enough (2 s) that the few requests a test makes while it runs are
    certainly answered before it ends: each takes milliseconds, even on a loaded machine."""
    return sim_pool_config(
        {"a": {"loadSeconds": 2.0, "unloadSeconds": 0.2, "tokensPerSecond": 50, "memoryGiB": 6}}
    )


async def test_load_unload_lifecycle_and_health(start_sim: StartSim, slow_load) -> None:
    """unloaded -> loading -> ready -> unloading -> unloaded, /health 503/503/200/503/503."""
    sim = await start_sim(slow_load, "a")
    assert await sim.state() == {
        "state": "unloaded",
        "pool": "gpu0",
        "member": "a",
        "error": None,
        "in_flight": 0,
        "epoch": None,
        "ledger_write_failures": 0,
        "held": [],
    }
    health = await sim.http.get("/health")
    assert (health.status_code, health.json()) == (503, LOADING)

    loading = await sim.load(epoch=1)
    assert (loading.status_code, loading.json()) == (202, {"state": "loading"})
    assert (await sim.http.get("/health")).status_code == 503
    assert (await sim.http.get("/slots")).status_code == 503
    again = await sim.load(epoch=1)
    assert (again.status_code, again.json()) == (200, {"state": "loading"})

    await sim.wait_for_state("ready")
    health = await sim.http.get("/health")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert (await sim.load(epoch=1)).json() == {"state": "ready"}

    unloading = await sim.unload(epoch=1)
    assert (unloading.status_code, unloading.json()) == (202, {"state": "unloading"})
    assert (await sim.http.get("/health")).status_code == 503
    assert (await sim.unload(epoch=1)).status_code == 200
    state = await sim.wait_for_state("unloaded")
    assert state["epoch"] == 1
    assert (await sim.http.get("/health")).status_code == 503
    idle = await sim.unload()
    assert (idle.status_code, idle.json()) == (200, {"state": "unloaded"})


async def test_stale_epoch_is_refused_with_409(start_sim: StartSim, slow_load) -> None:
    """An epoch lower than the highest seen is refused; equal, higher or none pass."""
    sim = await start_sim(slow_load, "a")
    assert (await sim.load(epoch=5)).status_code == 202
    stale = await sim.unload(epoch=4)
    assert stale.status_code == 409
    assert stale.json()["epoch"] == 5
    assert stale.json()["error"]["type"] == "conflict_error"
    assert (await sim.state())["state"] == "loading"
    assert (await sim.load(epoch=3)).status_code == 409
    await sim.wait_for_state("ready")
    assert (await sim.unload(epoch=5)).status_code == 202
    assert (await sim.load(epoch=7)).status_code == 202  # waits for the unload, then loads
    assert (await sim.unload()).status_code == 202
    assert (await sim.state())["epoch"] == 7


async def test_bad_control_bodies_get_400(start_sim: StartSim, config) -> None:
    """A non-integer epoch or a non-object body is a 400."""
    sim = await start_sim(config, "a")
    assert (await sim.http.post("/control/load", json={"epoch": "1"})).status_code == 400
    assert (await sim.http.post("/control/load", json={"epoch": True})).status_code == 400
    assert (await sim.http.post("/control/unload", json=[1])).status_code == 400
    assert (await sim.http.post("/control/load")).status_code == 202  # no body: manual use


async def test_load_while_unloading_waits_for_the_unload(
    start_sim: StartSim, config, redis, keys: Keys
) -> None:
    """A load that arrives mid-unload starts only after the memory was released."""
    sim = await start_sim(config, "a", loaded=True)
    assert (await sim.unload()).status_code == 202
    response = await sim.load()
    assert (response.status_code, response.json()) == (202, {"state": "loading"})
    await sim.wait_for_state("ready")
    timeline = await wait_for_timeline(
        redis, keys, "gpu0", lambda t: [e.event for e in t][-1] is LedgerEvent.LOADED
    )
    assert [e.event for e in timeline] == [
        LedgerEvent.LOAD_START,
        LedgerEvent.LOADED,
        LedgerEvent.UNLOAD_START,
        LedgerEvent.UNLOADED,
        LedgerEvent.LOAD_START,
        LedgerEvent.LOADED,
    ]


async def test_unload_drops_in_flight_requests(
    start_sim: StartSim, config, redis, keys: Keys
) -> None:
    """Unloading aborts running requests: a stream is cut, a plain request gets 503."""
    sim = await start_sim(config, "a", loaded=True)
    plain = asyncio.create_task(
        sim.http.post(
            "/v1/chat/completions",
            json={"model": "a", "messages": [{"role": "user", "content": "x"}], "max_tokens": 500},
        )
    )
    async with sim.openai() as client:
        stream = await client.chat.completions.create(
            model="a",
            messages=[{"role": "user", "content": "x"}],
            max_tokens=500,
            stream=True,
        )
        received = []

        async def consume_and_unload() -> None:
            async for chunk in stream:
                received.append(chunk)
                if len(received) == 2:
                    assert (await sim.state())["in_flight"] == 2
                    assert (await sim.unload()).status_code == 202

        with pytest.raises((openai.APIError, httpx.HTTPError)):
            await consume_and_unload()
        assert 2 <= len(received) < 100
    response = await plain
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "unavailable_error"
    assert (await sim.state())["in_flight"] == 0
    timeline = await wait_for_timeline(
        redis,
        keys,
        "gpu0",
        lambda t: sum(e.event is LedgerEvent.SERVE_END for e in t) == 2,
    )
    assert {e.fields["outcome"] for e in timeline if e.event is LedgerEvent.SERVE_END} == {
        "aborted"
    }


async def test_crash_fails_the_member_and_frees_its_memory(
    start_sim: StartSim, config, redis, keys: Keys
) -> None:
    """/control/crash: failed with the reason, /health 503, memory freed; unload clears it."""
    sim = await start_sim(config, "a", loaded=True)
    crashed = await sim.http.post("/control/crash", json={"reason": "segfault"})
    assert crashed.json() == {"state": "failed", "error": "segfault"}
    state = await sim.state()
    assert (state["state"], state["error"]) == ("failed", "segfault")
    health = await sim.http.get("/health")
    assert health.status_code == 503
    assert health.json()["error"]["message"] == "segfault"
    assert await redis.hgetall(keys.sim_resident("gpu0")) == {}
    timeline = await wait_for_timeline(
        redis, keys, "gpu0", lambda t: t[-1].event is LedgerEvent.UNLOADED
    )
    assert timeline[-1].fields["reason"] == "crash"
    cleared = await sim.unload()
    assert (cleared.status_code, cleared.json()) == (200, {"state": "unloaded"})
    assert (await sim.state())["error"] is None


async def test_a_held_phase_lasts_until_it_is_let_go(start_sim: StartSim, config) -> None:
    """/control/hold: an unload (0.2 s) and a load (0.3 s) whose phase is held are still in
    it when a long poll for their end times out a second later (the sim's own timers, in
    order), and end once let go; a body that names another phase is refused."""
    sim = await start_sim(config, "a", loaded=True)
    held = await sim.http.post("/control/hold", json={"phases": ["unloading", "loading"]})
    assert held.json()["held"] == ["loading", "unloading"]
    assert (await sim.unload(epoch=1)).status_code == 202
    still = await sim.http.get("/control/state", params={"until": "unloaded", "timeout": 1})
    assert still.json()["state"] == "unloading"
    await sim.http.post("/control/hold", json={"phases": ["loading"]})
    await sim.wait_for_state("unloaded")
    assert (await sim.load(epoch=1)).status_code == 202
    still = await sim.http.get("/control/state", params={"until": "ready", "timeout": 1})
    assert still.json()["state"] == "loading"
    await sim.http.post("/control/hold", json={"phases": []})
    assert (await sim.wait_for_state("ready"))["held"] == []
    for bad in ({"phases": ["ready"]}, {"phases": "loading"}, {"phases": [{}]}, {}):
        assert (await sim.http.post("/control/hold", json=bad)).status_code == 400, bad


async def test_state_long_poll_waits_for_the_wanted_state(start_sim: StartSim, config) -> None:
    """``GET /control/state?until=unloading,unloaded`` answers at the transition to one of
    those states, not before; with a short timeout it answers the current state."""
    sim = await start_sim(config, "a", loaded=True)
    waiting = asyncio.create_task(
        sim.http.get(
            "/control/state", params={"until": "unloading,unloaded", "timeout": 30}, timeout=40
        )
    )
    short = await sim.http.get("/control/state", params={"until": "loading", "timeout": 0.2})
    assert short.json()["state"] == "ready"  # its timeout ran out: the state as it is
    assert not waiting.done()  # ready is not what it waits for
    assert (await sim.unload()).status_code == 202
    answer = await waiting
    assert answer.json()["state"] in {"unloading", "unloaded"}
