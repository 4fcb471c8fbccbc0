"""Capacity pools end to end (docs/adr/0008): real sims, controllers and routers on real
NATS and Redis, one simulated GPU of 24 GiB whose members are resident together while
their memory fits. Every test ends with the ledger's verdict against the capacity: never
over it, nothing cut, nothing served by a member that was not ready."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from hotseat.launcher import find_binary, free_port
from hotseat.status_cli import format_pools
from hotseat_common.keys import Keys
from hotseat_common.messages import PoolView
from hotseat_pool_controller.drivers.processgroup import read_pid_file
from hotseat_sim.timeline import LedgerEntry, LedgerEvent
from tests.controller.test_scheduler_e2e import _waited_ms, endless_demand, swaps_started
from tests.support.clients import stream_chat
from tests.support.stack import Stack
from tests.support.waiting import eventually

Make = Callable[[dict[str, Any]], Stack]

SMALL = {"loadSeconds": 0.3, "unloadSeconds": 0.1, "tokensPerSecond": 20, "slots": 4}


def capacity_config(
    members: Mapping[str, Mapping[str, Any]],
    *,
    pool: Mapping[str, Any] | None = None,
    gib: float = 24,
) -> dict[str, Any]:
    """A capacity pool ``gpu0`` of ``gib`` GiB; each member's mapping has its ``memoryGiB``
    (and ``pinned``) and its sim's settings (``sim``). A rule per member (its name, Wait)
    and one IfIdle (``<name>-ifidle``)."""
    ports = {name: free_port() for name in members}
    rules: list[dict[str, Any]] = []
    for name in members:
        rules.append({"name": name, "match": {"models": [name]}, "route": {"backends": [name]}})
        rules.append({
            "name": f"{name}-ifidle",
            "match": {"models": [f"{name}-ifidle"]},
            "route": {"backends": [name], "poolActivation": "IfIdle"},
        })  # fmt: skip
    return {
        "router": {"name": "r", "requestTimeout": "60s"},
        "backends": [
            {
                "name": name,
                "address": f"http://127.0.0.1:{port}",
                "pool": {"name": "gpu0", "member": name},
            }
            for name, port in ports.items()
        ],
        "pools": [
            {
                "name": "gpu0",
                "swapBudget": "30s",
                "leaseTtl": "2s",
                "capacity": {"gpuMemoryGiB": gib},
                "driver": {"kind": "sim"},
                "members": [
                    {
                        "name": name,
                        "memoryGiB": spec["memoryGiB"],
                        **({"pinned": True} if spec.get("pinned") else {}),
                        "sim": {**SMALL, **spec.get("sim", {})},
                    }
                    for name, spec in members.items()
                ],
                **(pool or {}),
            }
        ],
        "rules": rules,
    }


def started(stack: Stack, controllers: int = 1) -> Stack:
    stack.start_sims()
    for i in range(controllers):
        stack.start_controller(f"c{i + 1}")
    stack.start_router()
    return stack


async def chat(url: str, model: str, max_tokens: int = 1, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=90) as client:
        return await client.post(
            f"{url}/v1/chat/completions",
            json={
                "model": model,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": max_tokens,
            },
            headers=headers,
        )


async def wait_residents(stack: Stack, members: set[str], timeout: float = 20) -> dict[str, Any]:
    """Until the pool's residency set is ``members`` and no plan is in flight."""

    async def settled() -> dict[str, Any] | None:
        state = await stack.pool()
        done = state["phase"] == "idle" and set(state["residents"]) == members
        return state if done and not state["evicting"] else None

    result: dict[str, Any] = await eventually(settled, timeout=timeout)
    return result


def events(ledger: list[LedgerEntry], event: LedgerEvent, member: str) -> list[LedgerEntry]:
    return [e for e in ledger if e.event is event and e.member == member]


def index(ledger: list[LedgerEntry], entry: LedgerEntry) -> int:
    return next(i for i, e in enumerate(ledger) if e.id == entry.id)


@contextlib.asynccontextmanager
async def streaming(url: str, model: str, tokens: int = 60):  # type: ignore[no-untyped-def]
    """One long request for ``model`` (``tokens`` at 20 tokens/s), in flight until its
    sim has started serving it; yields the task."""
    task = asyncio.create_task(chat(url, model, max_tokens=tokens))
    try:
        yield task
    finally:
        if not task.done():
            await task


async def serving(stack: Stack, member: str) -> None:
    """Until ``member``'s sim has a request in flight (its ledger says serve_start)."""

    async def started_serving() -> bool:
        ledger = await stack.ledger()
        return len(events(ledger, LedgerEvent.SERVE_START, member)) > len(
            events(ledger, LedgerEvent.SERVE_END, member)
        )

    await eventually(started_serving, timeout=20)


async def test_two_small_members_serve_while_a_third_loads(make_stack: Make) -> None:
    """a and b (6 GiB each) are resident together; c (8 GiB, a 10 s load) fits beside
    them: it loads with no unload and no drain, and a and b serve throughout."""
    stack = started(
        make_stack(
            capacity_config(
                {
                    "a": {"memoryGiB": 6},
                    "b": {"memoryGiB": 6},
                    # A long load: the requests sent once it began reach a and b before it ends
                    # even on a loaded machine.
                    "c": {"memoryGiB": 8, "sim": {"loadSeconds": 10.0}},
                }
            )
        )
    )
    url = stack.routers[0].url
    for member in ("a", "b"):
        assert (await chat(url, member)).status_code == 200
    await wait_residents(stack, {"a", "b"})
    async with streaming(url, "a") as on_a, streaming(url, "b") as on_b:
        await serving(stack, "a")
        await serving(stack, "b")
        loaded = asyncio.create_task(chat(url, "c"))

        async def c_loading() -> bool:
            return bool(events(await stack.ledger(), LedgerEvent.LOAD_START, "c"))

        await eventually(c_loading, timeout=20)
        # While c loads, a and b are granted and serve new requests at once.
        during = await asyncio.gather(chat(url, "a"), chat(url, "b"))
        assert [r.status_code for r in during] == [200, 200]
        assert (await loaded).status_code == 200
    assert (await on_a).status_code == 200
    assert (await on_b).status_code == 200
    state = await wait_residents(stack, {"a", "b", "c"})
    assert state["free_gib"] == 4
    row = format_pools([PoolView.model_validate(state)]).splitlines()[1]  # `hotseat status`
    assert row.split()[:2] == ["gpu0", "a,b,c"], row
    assert "(4 of 24 GiB free)" in row, row
    ledger = await stack.judged_ledger()
    assert not [e for e in ledger if e.event is LedgerEvent.UNLOAD_START]
    c_start = index(ledger, events(ledger, LedgerEvent.LOAD_START, "c")[0])
    c_ready = index(ledger, events(ledger, LedgerEvent.LOADED, "c")[0])
    served_meanwhile = {
        e.member for e in ledger[c_start:c_ready] if e.event is LedgerEvent.SERVE_START
    }
    assert served_meanwhile == {"a", "b"}
    started_events = [e for e in await stack.settled_audit() if e["outcome"] == "swap_started"]
    assert {(e["to_member"], e["reason"], e.get("evicts")) for e in started_events} == {
        ("a", "fits", None),
        ("b", "fits", None),
        ("c", "fits", None),
    }


async def test_two_members_that_fit_together_load_at_once(make_stack: Make) -> None:
    """x and y (6 GiB each, 2 s loads) are asked for together while slow (8 GiB) loads:
    they wait for its plan, then one plan loads them both at the same time beside it
    (their loads overlap on the ledger, swap_started names the other as ``also``), and
    both are served; the ledger never goes over the 24 GiB."""
    load = {"loadSeconds": 2.0}
    stack = started(
        make_stack(
            capacity_config(
                {
                    # A long load: x's and y's requests are held behind it before it ends.
                    "slow": {"memoryGiB": 8, "sim": {"loadSeconds": 5.0}},
                    "x": {"memoryGiB": 6, "sim": load},
                    "y": {"memoryGiB": 6, "sim": load},
                }
            )
        )
    )
    url = stack.routers[0].url
    on_slow = asyncio.create_task(chat(url, "slow"))

    async def slow_loading() -> bool:
        return bool(events(await stack.ledger(), LedgerEvent.LOAD_START, "slow"))

    await eventually(slow_loading, timeout=20)
    both = asyncio.gather(chat(url, "x"), chat(url, "y"))

    async def both_held_behind_slow() -> bool:
        state = await stack.pool()
        waiting = state["waiters"]
        return state["loading"] == "slow" and waiting["x"] > 0 and waiting["y"] > 0

    await eventually(both_held_behind_slow, timeout=20)
    assert (await on_slow).status_code == 200
    assert [r.status_code for r in await both] == [200, 200]
    await wait_residents(stack, {"slow", "x", "y"})
    ledger = await stack.judged_ledger()  # never over capacity, nothing cut
    starts = [index(ledger, events(ledger, LedgerEvent.LOAD_START, m)[0]) for m in ("x", "y")]
    ready = [index(ledger, events(ledger, LedgerEvent.LOADED, m)[0]) for m in ("x", "y")]
    assert max(starts) < min(ready), "x and y loaded one after the other"
    slow_ready = index(ledger, events(ledger, LedgerEvent.LOADED, "slow")[0])
    assert slow_ready < min(starts)
    pool_events = [e for e in await stack.settled_audit() if e["kind"] == "pool"]
    started_events = [e for e in pool_events if e["outcome"] == "swap_started"]
    assert {(e["to_member"], e.get("also")) for e in started_events} in (
        {("slow", None), ("x", "y")},
        {("slow", None), ("y", "x")},
    ), [(e["outcome"], e.get("to_member"), e.get("also"), e.get("reason")) for e in pool_events]


async def test_a_large_member_evicts_only_the_idle_member(make_stack: Make) -> None:
    """a streams, b is idle; big (16 GiB) needs 4 GiB more than is free: b alone is
    evicted, a serves on and its stream completes."""
    stack = started(
        make_stack(
            capacity_config(
                {
                    "a": {"memoryGiB": 6},
                    "b": {"memoryGiB": 6},
                    "big": {"memoryGiB": 16},
                }
            )
        )
    )
    url = stack.routers[0].url
    for member in ("a", "b"):
        assert (await chat(url, member)).status_code == 200
    await wait_residents(stack, {"a", "b"})
    async with streaming(url, "a") as on_a:
        await serving(stack, "a")
        assert (await chat(url, "big")).status_code == 200
    assert (await on_a).status_code == 200
    await wait_residents(stack, {"a", "big"})
    ledger = await stack.judged_ledger()
    assert [e.member for e in ledger if e.event is LedgerEvent.UNLOAD_START] == ["b"]
    started_events = [e for e in await stack.settled_audit() if e["outcome"] == "swap_started"]
    last = started_events[-1]
    assert (last["to_member"], last["reason"], last["evicts"]) == ("big", "evict_idle", "b")


async def test_a_busy_member_is_never_evicted_wait_holds_and_if_idle_skips(
    make_stack: Make,
) -> None:
    """big (20 GiB) needs a and b both gone, and a streams: IfIdle is told busy at once;
    Wait holds until a's stream ends, then a and b go and big is served."""
    stack = started(
        make_stack(
            capacity_config(
                {
                    "a": {"memoryGiB": 6},
                    "b": {"memoryGiB": 6},
                    "big": {"memoryGiB": 20},
                }
            )
        )
    )
    url = stack.routers[0].url
    for member in ("a", "b"):
        assert (await chat(url, member)).status_code == 200
    await wait_residents(stack, {"a", "b"})
    async with streaming(url, "a", tokens=80) as on_a:
        await serving(stack, "a")
        skipped = await chat(url, "big-ifidle")
        assert skipped.status_code == 503, skipped.text
        assert skipped.json()["error"]["code"] == "pool_incumbent_busy"
        held = await chat(url, "big")
        assert held.status_code == 200, held.text
    assert (await on_a).status_code == 200
    await wait_residents(stack, {"big"})
    ledger = await stack.judged_ledger()
    a_done = index(ledger, events(ledger, LedgerEvent.SERVE_END, "a")[-1])
    big_start = index(ledger, events(ledger, LedgerEvent.LOAD_START, "big")[0])
    assert big_start > a_done, "big loaded before a's stream ended"


async def test_a_pinned_member_is_never_evicted(make_stack: Make) -> None:
    """p is pinned (loaded at start) and the least recently used; big (16 GiB) needs one
    member gone: s goes, p stays."""
    stack = started(
        make_stack(
            capacity_config(
                {
                    "p": {"memoryGiB": 6, "pinned": True},
                    "s": {"memoryGiB": 6},
                    "big": {"memoryGiB": 16},
                }
            )
        )
    )
    url = stack.routers[0].url
    await wait_residents(stack, {"p"})
    assert (await chat(url, "s")).status_code == 200
    assert (await chat(url, "big")).status_code == 200
    await wait_residents(stack, {"p", "big"})
    ledger = await stack.judged_ledger()
    assert [e.member for e in ledger if e.event is LedgerEvent.UNLOAD_START] == ["s"]
    assert len(events(ledger, LedgerEvent.LOAD_START, "p")) == 1


async def test_eviction_order_is_cheapest_reload_then_least_recently_used(
    make_stack: Make,
) -> None:
    """a, b (quick loads) and slow (a 2 s load) are resident; big needs 6 GiB more:
    slow is spared for its reload cost, and of a and b the one used longer ago goes."""
    stack = started(
        make_stack(
            capacity_config(
                {
                    "a": {"memoryGiB": 6},
                    "b": {"memoryGiB": 6},
                    "slow": {"memoryGiB": 8, "sim": {"loadSeconds": 2.0}},
                    "big": {"memoryGiB": 10},
                }
            )
        )
    )
    url = stack.routers[0].url
    for member in ("slow", "a", "b"):
        assert (await chat(url, member)).status_code == 200
    await wait_residents(stack, {"a", "b", "slow"})
    assert (await chat(url, "a")).status_code == 200  # b is now the least recently used
    assert (await chat(url, "big")).status_code == 200
    await wait_residents(stack, {"a", "slow", "big"})
    ledger = await stack.judged_ledger()
    assert [e.member for e in ledger if e.event is LedgerEvent.UNLOAD_START] == ["b"]


async def test_of_two_members_of_the_same_reload_cost_the_one_asked_for_least_goes(
    make_stack: Make,
) -> None:
    """a and b load alike; a serves a burst of 5 concurrent requests (sharing the
    router's lease or not, each counts), then b one request, so b is the more recently
    used: big needs one of them gone, and b goes (least recently used alone would take
    a)."""
    stack = started(
        make_stack(
            capacity_config(
                {"a": {"memoryGiB": 6}, "b": {"memoryGiB": 6}, "big": {"memoryGiB": 16}}
            )
        )
    )
    url = stack.routers[0].url
    for member in ("a", "b"):
        assert (await chat(url, member)).status_code == 200
    await wait_residents(stack, {"a", "b"})
    burst = await asyncio.gather(*(chat(url, "a", max_tokens=4) for _ in range(5)))
    assert [r.status_code for r in burst] == [200] * 5
    assert (await chat(url, "b")).status_code == 200
    assert (await chat(url, "big")).status_code == 200
    await wait_residents(stack, {"a", "big"})
    ledger = await stack.judged_ledger()
    assert [e.member for e in ledger if e.event is LedgerEvent.UNLOAD_START] == ["b"]


async def test_a_controller_killed_during_an_eviction_never_goes_over_capacity(
    make_stack: Make,
) -> None:
    """Two controllers; the plan's owner is SIGKILLed while it unloads b (a slow unload):
    the other takes the plan over, confirms b gone before big loads, and the pool
    converges with big and a resident; the GPU never held more than its capacity."""
    stack = started(
        make_stack(
            capacity_config(
                {
                    "a": {"memoryGiB": 6},
                    "b": {"memoryGiB": 6, "sim": {"unloadSeconds": 3.0}},
                    "big": {"memoryGiB": 16},
                }
            )
        ),
        controllers=2,
    )
    url = stack.routers[0].url
    for member in ("a", "b"):
        assert (await chat(url, member)).status_code == 200
    await wait_residents(stack, {"a", "b"})
    assert (await chat(url, "a")).status_code == 200  # b is the least recently used
    request = asyncio.create_task(chat(url, "big"))

    async def evicting() -> str | None:
        state = await stack.state_hash()
        return state.get("owner") if state.get("phase") == "unloading" else None

    owner = await eventually(evicting, timeout=20, interval=0.02)
    stack.controllers[owner].kill()
    response = await request
    assert response.status_code == 200, response.text
    await wait_residents(stack, {"a", "big"}, timeout=90)
    verdict = await stack.assert_invariants()
    assert verdict.summary()["over_capacity"] == 0
    ledger = await stack.ledger()
    b_gone = index(ledger, events(ledger, LedgerEvent.UNLOADED, "b")[0])
    big_start = index(ledger, events(ledger, LedgerEvent.LOAD_START, "big")[0])
    assert big_start > b_gone


async def test_process_driver_runs_co_resident_members_and_stops_only_the_evicted(
    make_stack: Make, tmp_path: Path
) -> None:
    """The process driver with sim servers as its members' commands: a and b run as two
    processes at once; c evicts one of them (the cheaper to start again, as measured):
    its process is gone and its port closed, the other's is the same one and serves on."""
    data = tmp_path / "data"
    config = capacity_config(
        {
            "a": {"memoryGiB": 6},
            "b": {"memoryGiB": 6},
            "c": {"memoryGiB": 16},
        }
    )
    sim = find_binary("hotseat-sim")
    pool = config["pools"][0]
    pool["driver"] = {"kind": "process", "stopGracePeriod": "2s", "dataDir": str(data)}
    for member in pool["members"]:
        member["process"] = {
            "command": [
                sim, "--config", str(tmp_path / "hotseat.yaml"), "--backend", member["name"],
                "--load-on-start", "true", "--log-format", "console",
            ]
        }  # fmt: skip
    stack = make_stack(config)
    stack.start_controller("c1")
    stack.start_router()
    await stack.wait_pool_known()
    url = stack.routers[0].url
    for member in ("a", "b"):
        response = await chat(url, member)
        assert response.status_code == 200, response.text
    await wait_residents(stack, {"a", "b"})
    pids = {m: read_pid_file(data / "gpu0" / f"{m}.pid") for m in ("a", "b")}
    assert (await chat(url, "c")).status_code == 200
    started_events = [e for e in await stack.settled_audit() if e["outcome"] == "swap_started"]
    evicted = started_events[-1]["evicts"]  # the cheaper reload (its measured start time)
    (kept,) = {"a", "b"} - {evicted}
    await wait_residents(stack, {kept, "c"})
    port = next(
        int(b["address"].rsplit(":", 1)[1]) for b in config["backends"] if b["name"] == evicted
    )
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, f"{evicted} still listens"
    assert read_pid_file(data / "gpu0" / f"{evicted}.pid") is None
    before, now = pids[kept], read_pid_file(data / "gpu0" / f"{kept}.pid")
    assert before is not None
    assert now is not None
    assert now.pid == before.pid, f"{kept} was restarted"
    assert (await chat(url, kept)).status_code == 200
    ledger = await stack.judged_ledger()
    assert [e.member for e in ledger if e.event is LedgerEvent.UNLOADED] == [evicted]


async def test_under_leases_and_slots_a_member_at_work_without_a_lease_is_not_evicted(
    make_stack: Make,
) -> None:
    """busySignal leasesAndSlots: a streams a request sent straight to its server (no
    lease: only its /slots show it); big needs one of a and b gone. a, least recently
    used, would go first by leases alone: its /slots are read busy, b goes instead, and
    a's request completes. With both at work that way, IfIdle is told busy at once."""
    stack = started(
        make_stack(
            capacity_config(
                {"a": {"memoryGiB": 6}, "b": {"memoryGiB": 6}, "big": {"memoryGiB": 16}},
                pool={"busySignal": "leasesAndSlots"},
            )
        )
    )
    url = stack.routers[0].url
    for member in ("a", "b"):
        assert (await chat(url, member)).status_code == 200
    await wait_residents(stack, {"a", "b"})
    async with streaming(stack.sims["a"].url, "a", tokens=200) as direct:  # 10 s
        await serving(stack, "a")
        assert (await chat(url, "big")).status_code == 200
        assert not direct.done()
    assert (await direct).status_code == 200
    await wait_residents(stack, {"a", "big"})
    ledger = await stack.judged_ledger()
    assert [e.member for e in ledger if e.event is LedgerEvent.UNLOAD_START] == ["b"]
    await stack.wait_slots_idle("a")
    assert (await chat(url, "a")).status_code == 200
    assert (await chat(url, "b")).status_code == 200  # evicts big, used less recently
    await wait_residents(stack, {"a", "b"})
    async with (
        streaming(stack.sims["a"].url, "a", tokens=200) as on_a,
        streaming(stack.sims["b"].url, "b", tokens=200) as on_b,
    ):
        await serving(stack, "a")
        await serving(stack, "b")
        skipped = await chat(url, "big-ifidle")
        assert skipped.status_code == 503, skipped.text
        assert skipped.json()["error"]["code"] == "pool_incumbent_busy"
    assert [(await on_a).status_code, (await on_b).status_code] == [200, 200]
    await stack.judged_ledger()


def answered_past(statuses: list[int], count: int) -> Callable[[], Awaitable[bool]]:
    async def answered() -> bool:
        return len(statuses) > count

    return answered


def max_wait_config(pool: Mapping[str, Any]) -> dict[str, Any]:
    """chatty (16 GiB) and small (4 GiB) resident together; coder (16 GiB) fits only once
    chatty is gone (small alone frees too little, and is not needed)."""
    return capacity_config(
        {"chatty": {"memoryGiB": 16}, "small": {"memoryGiB": 4}, "coder": {"memoryGiB": 16}},
        pool=pool,
    )


async def chatty_and_small_resident(make_stack: Make, pool: Mapping[str, Any]) -> Stack:
    """The maxWait pool started, chatty and small each served once and both resident."""
    stack = started(make_stack(max_wait_config(pool)))
    url = stack.routers[0].url
    for member in ("chatty", "small"):
        assert (await chat(url, member)).status_code == 200
    await wait_residents(stack, {"chatty", "small"})
    return stack


async def test_without_max_wait_a_waiter_behind_endless_demand_is_held_to_its_budget(
    make_stack: Make,
) -> None:
    """chatty always has a request in flight (a 10 s stream under its endless demand, so
    that no gap between its requests can open on a loaded host): without maxWait (sticky
    residency) a request for coder is held to its budget and answered 503
    pool_activation_timeout."""
    stack = await chatty_and_small_resident(make_stack, {"swapBudget": "4s"})
    url = stack.routers[0].url
    async with streaming(url, "chatty", tokens=200):
        await serving(stack, "chatty")  # the stream, alone on it
        async with endless_demand(url, "chatty") as statuses:
            held = await chat(url, "coder")
    code = held.json()["error"]["code"] if held.status_code != 200 else None
    assert (held.status_code, code) == (503, "pool_activation_timeout"), held.text
    assert set(statuses) == {200}
    assert (await stack.pool())["closing"] == []
    await stack.assert_invariants()


async def test_max_wait_closes_the_busy_resident_a_waiter_needs(make_stack: Make) -> None:
    """The same endless demand with maxWait 1s: chatty is closed (new requests for it are
    held, the router stops sharing its 15 s lease), drains, and is evicted for coder,
    which is served; small, resident beside them and not needed, keeps serving and is
    never unloaded; chatty's held requests are served after it comes back, none cut. A
    6 s stream on chatty keeps it busy past maxWait whatever gaps its endless demand has
    on a loaded host (a gap before maxWait would let coder in without a close)."""
    pool = {"maxWait": "1s", "minResidency": "0s", "leaseTtl": "15s"}
    stack = await chatty_and_small_resident(make_stack, pool)
    url = stack.routers[0].url
    async with streaming(url, "chatty", tokens=120):
        await serving(stack, "chatty")  # the stream, alone on it
        async with endless_demand(url, "chatty") as statuses:
            coder = asyncio.create_task(chat(url, "coder"))

            async def chatty_closed() -> bool:
                return (await stack.pool())["closing"] == ["chatty"]

            await eventually(chatty_closed, timeout=30)
            assert (await chat(url, "small")).status_code == 200  # not closed: granted at once
            served = await coder
            assert (served.status_code, served.headers.get("x-hotseat-backend")) == (200, "coder")
            assert int(served.headers["x-hotseat-hold-ms"]) >= 1000  # it waited maxWait at least
            # chatty's held requests, and new ones, are served once it is back.
            await eventually(answered_past(statuses, len(statuses) + 2), timeout=60)
    assert set(statuses) == {200}, statuses
    ledger = await stack.judged_ledger()
    assert events(ledger, LedgerEvent.UNLOAD_START, "small") == []
    chatty_done = events(ledger, LedgerEvent.SERVE_END, "chatty")
    coder_load = index(ledger, events(ledger, LedgerEvent.LOAD_START, "coder")[0])
    last_before = [e for e in chatty_done if index(ledger, e) < coder_load]
    assert last_before, "coder loaded before chatty drained"
    started_events = [e for e in await stack.settled_audit() if e["outcome"] == "swap_started"]
    to_coder = next(e for e in started_events if e["to_member"] == "coder")
    assert (to_coder["reason"], to_coder["evicts"]) == ("evict_idle", "chatty")


async def _chatty_closed_since(stack: Stack, arrival: float) -> dict[str, str] | None:
    """The pool's state once chatty is closed by a close at or after ``arrival`` (ms, store
    clock; its ``closedat`` is the pool's first close)."""
    state = await stack.state_hash()
    at = int(state.get("closedat") or 0)
    return state if state.get("closing") == "chatty" and at >= arrival else None


def _urgency(stack: Stack, member: str) -> str:
    return Keys(stack.prefix).pool_waiter_urgency("gpu0", member)


async def _coder_arrival(stack: Stack) -> float:
    """A coder request was sent: when its waiter arrived (ms, store clock)."""
    arrival: float = await eventually(
        lambda: _waited_ms(stack, _urgency(stack, "coder"), 0), timeout=30
    )
    return arrival


async def test_a_waiter_in_line_before_a_residents_commit_is_not_held_by_its_min_residency(
    make_stack: Make,
) -> None:
    """small and coder are resident; a chatty stream (10 s) evicts the idle coder and loads
    chatty (a 3 s load), and a coder request arrives during that load. Once chatty is
    resident its own demand never stops (the stream, and endless demand beside it).
    minResidency 60s, maxWait 2s: coder's waiter was in line before chatty's commit, so
    its maxWait wins over chatty's dwell (docs/adr/0006, as in a one-resident pool):
    chatty is closed long before its minResidency (read from the store: the close's
    moment against chatty's commit), drains, and is evicted for coder, which is served
    (held by the dwell it would be answered 503 at its 30 s budget). chatty's requests
    held by the close are served after its swap back; small is never unloaded; nothing
    is cut."""
    pool = {"maxWait": "2s", "minResidency": "60s", "swapBudget": "30s", "leaseTtl": "15s"}
    config = capacity_config(
        {
            "chatty": {"memoryGiB": 16, "sim": {"loadSeconds": 3.0}},
            "small": {"memoryGiB": 4},
            "coder": {"memoryGiB": 16},
        },
        pool=pool,
    )
    stack = started(make_stack(config))
    url = stack.routers[0].url
    for member in ("small", "coder"):
        assert (await chat(url, member)).status_code == 200
    await wait_residents(stack, {"small", "coder"})

    async def loading_chatty() -> bool:
        state = await stack.state_hash()
        return state.get("phase") in ("unloading", "loading") and state.get("target") == "chatty"

    async with streaming(url, "chatty", tokens=200):
        await eventually(loading_chatty, timeout=30)
        waiting = asyncio.create_task(chat(url, "coder"))
        arrival = await _coder_arrival(stack)
        assert await loading_chatty(), "coder's waiter came after chatty's commit: no test"
        # Watched from now: the close may come before the endless demand is established
        # (its second request is then held until chatty's swap back).
        closing = asyncio.create_task(
            eventually(lambda: _chatty_closed_since(stack, arrival), timeout=60)
        )
        async with endless_demand(url, "chatty") as statuses:
            closed = await closing
            served = await waiting
            assert (served.status_code, served.headers.get("x-hotseat-backend")) == (200, "coder")
            await eventually(answered_past(statuses, len(statuses) + 2), timeout=60)
    assert set(statuses) == {200}, statuses
    committed = int(closed["loaded.chatty"])
    assert arrival <= committed, (arrival, committed)  # in line before chatty's commit
    assert int(closed["closedat"]) - committed < 60_000  # closed within chatty's dwell
    to_coder = [e for e in await swaps_started(stack) if e["to_member"] == "coder"]
    assert (to_coder[-1]["reason"], to_coder[-1]["evicts"]) == ("evict_idle", "chatty")
    ledger = await stack.judged_ledger()
    assert events(ledger, LedgerEvent.UNLOAD_START, "small") == []
    await stack.assert_invariants()


MAX_WAIT_6S_MS = 6_000


async def test_max_wait_closes_a_busy_resident_earlier_by_its_measured_drain(
    make_stack: Make,
) -> None:
    """chatty served one 6 s stream (120 tokens at 20 tokens/s) alone: its router's
    release tells the controller how long it ran. chatty then serves a 10 s stream and
    endless demand beside it. A coder request behind it (coder needs chatty's memory)
    closes chatty before its waiter has waited maxWait (6 s), by the longest of chatty's
    measured request times and drains, as a one-resident pool's close does (without the
    estimate the close came at maxWait itself); that drain is then recorded too (from
    the close to the plan that evicts chatty). The moments are read from the store (its
    clock): the coder waiter's arrival and the close's. Nothing is cut."""
    pool = {"maxWait": f"{MAX_WAIT_6S_MS // 1000}s", "minResidency": "0s", "leaseTtl": "15s"}
    stack = await chatty_and_small_resident(make_stack, pool)
    url = stack.routers[0].url
    async with httpx.AsyncClient(timeout=60) as client:
        alone = await stream_chat(client, url, "chatty", 120)
    assert (alone.status, alone.done) == (200, True)
    measured = await eventually(lambda: stack.request_times("chatty"), timeout=30)
    assert await stack.drain_times("chatty") == []
    async with streaming(url, "chatty", tokens=200):
        await serving(stack, "chatty")  # the stream, alone on it
        async with endless_demand(url, "chatty") as statuses:
            waiting = asyncio.create_task(chat(url, "coder"))
            arrival = await _coder_arrival(stack)
            closed = await eventually(lambda: _chatty_closed_since(stack, arrival), timeout=30)
            # What the estimate could have been at the close: every time kept by then.
            kept = await stack.request_times("chatty") + await stack.drain_times("chatty")
            served = await waiting
            assert (served.status_code, served.headers.get("x-hotseat-backend")) == (200, "coder")
            drains = await eventually(lambda: stack.drain_times("chatty"), timeout=30)
            await eventually(answered_past(statuses, len(statuses) + 2), timeout=60)
    waited_at_close = int(closed["closedat"]) - int(arrival)
    assert waited_at_close < MAX_WAIT_6S_MS, (waited_at_close, measured)
    assert waited_at_close >= MAX_WAIT_6S_MS - round(max(kept) * 1000) - 1, (waited_at_close, kept)
    assert len(drains) == 1
    assert set(statuses) == {200}, statuses
    await stack.assert_invariants()


async def test_a_higher_priority_waiter_that_came_during_a_load_closes_it_at_its_commit(
    make_stack: Make,
) -> None:
    """small and coder are resident; a chatty request (priority 0) evicts the idle coder
    and loads chatty (the test holds the sim's load), and a coder request of priority 5
    arrives during that load: a load that began finishes, but the plan's commit itself
    closes chatty (maxWait 2s; minResidency 60s gives way to a waiter in line before the
    commit) and admits not even the request it was loaded for: coder is swapped back in
    and served first, and chatty's request, held, is served by its swap back, not by the
    plan that first loaded chatty. small is never unloaded; nothing is cut."""
    pool = {"maxWait": "2s", "minResidency": "60s"}
    config = max_wait_config(pool)
    for rule in config["rules"]:
        rule["priorityHeader"] = {"allow": True, "max": 9}
    stack = started(make_stack(config))
    url = stack.routers[0].url
    for member in ("small", "coder"):
        assert (await chat(url, member)).status_code == 200
    await wait_residents(stack, {"small", "coder"})
    await stack.hold_sim("chatty", "loading")
    low = asyncio.create_task(chat(url, "chatty"))

    async def loading_chatty() -> dict[str, str] | None:
        state = await stack.state_hash()
        return state if (state.get("phase"), state.get("target")) == ("loading", "chatty") else None

    first = await eventually(loading_chatty, timeout=30)
    high = asyncio.create_task(chat(url, "coder", **{"x-hotseat-priority": "5"}))
    await eventually(lambda: _waited_ms(stack, _urgency(stack, "coder"), 0), timeout=30)
    await stack.hold_sim("chatty")  # chatty's load ends
    served_high, served_low = await high, await low
    assert (served_high.status_code, served_high.headers.get("x-hotseat-backend")) == (
        200,
        "coder",
    ), served_high.text
    assert (served_low.status_code, served_low.headers.get("x-hotseat-backend")) == (
        200,
        "chatty",
    ), served_low.text
    assert served_low.headers["x-hotseat-swap-id"] != first["swap"]
    pool_events = [e for e in await stack.settled_audit() if e["kind"] == "pool"]
    completed = [e["to_member"] for e in pool_events if e["outcome"] == "swap_completed"]
    assert completed[-3:] == ["chatty", "coder", "chatty"], completed
    ledger = await stack.judged_ledger()
    assert events(ledger, LedgerEvent.UNLOAD_START, "small") == []
    await stack.assert_invariants()
