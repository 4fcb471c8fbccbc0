"""Fleet placement end to end (docs/adr/0012): real sims, controllers and routers on real
NATS and Redis, four one-resident pools gpu0..gpu3 that can each hold the group's model
``assistant`` or their own ``other``. Every test ends with each GPU's ledger verdict:
never two residents, nothing cut, nothing served by a member that was not ready."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis

from hotseat.launcher import free_port
from hotseat.status_cli import format_groups
from hotseat_common.keys import Keys
from hotseat_common.messages import PoolList
from hotseat_sim.timeline import LedgerEvent
from tests.controller.test_capacity_e2e import chat
from tests.support.clients import chat_body, live_stream
from tests.support.stack import Stack
from tests.support.waiting import eventually

Make = Callable[[dict[str, Any]], Stack]

# Eight sims, a controller and up to three routers start per test: on a loaded two-core
# host that alone can take a minute, past the suite's default bound.
pytestmark = pytest.mark.timeout(300)

POOLS = ("gpu0", "gpu1", "gpu2", "gpu3")
SIM = {"loadSeconds": 0.3, "unloadSeconds": 0.1, "tokensPerSecond": 20, "slots": 8}


def fleet_config(
    *,
    defaults: Mapping[str, str],
    other_load_s: Mapping[str, float] | None = None,
    assistant_load_s: float = 0.3,
    slots: int = 4,
    max_copies: int = 1,
    coder_load_s: float | None = None,
) -> dict[str, Any]:
    """Four pools, each with ``assistant`` and ``other`` (its default from ``defaults``);
    the group ``assistant`` over the four ``gpuN-assistant`` backends; rules: ``assistant``
    (Wait), ``assistant-ifidle`` (IfIdle, then gpu0's ``other``), ``other-N`` (gpuN's
    ``other``). With ``coder_load_s``, each pool also has ``coder`` and the group
    ``coder`` (one copy) with its rule."""
    members = ("assistant", "other", *(("coder",) if coder_load_s is not None else ()))
    backends = [
        {
            "name": f"{pool}-{member}",
            "address": f"http://127.0.0.1:{free_port()}",
            "pool": {"name": pool, "member": member},
        }
        for pool in POOLS
        for member in members
    ]
    loads = other_load_s or {}
    pools = [
        {
            "name": pool,
            "swapBudget": "30s",
            "leaseTtl": "3s",
            "driver": {"kind": "sim"},
            **({"default": defaults[pool]} if pool in defaults else {}),
            "members": [
                {"name": "assistant", "sim": {**SIM, "loadSeconds": assistant_load_s}},
                {"name": "other", "sim": {**SIM, "loadSeconds": loads.get(pool, 0.3)}},
                *(
                    [{"name": "coder", "sim": {**SIM, "loadSeconds": coder_load_s}}]
                    if coder_load_s is not None
                    else []
                ),
            ],
        }
        for pool in POOLS
    ]

    def rule(name: str, backends: list[str], activation: str = "Wait") -> dict[str, Any]:
        route = {"backends": backends, "poolActivation": activation}
        return {"name": name, "match": {"models": [name]}, "route": route}

    rules = [
        rule("assistant", ["assistant"]),
        rule("assistant-ifidle", ["assistant", "gpu0-other"], "IfIdle"),
        *(rule(f"other-{p}", [f"{p}-other"]) for p in POOLS),
        *([rule("coder", ["coder"])] if coder_load_s is not None else []),
    ]
    groups = [
        {
            "name": name,
            "maxCopies": copies,
            "members": [{"backend": f"{p}-{name}", "slots": slots} for p in POOLS],
        }
        for name, copies in (("assistant", max_copies), ("coder", 1))
        if name in members
    ]
    return {
        "router": {"name": "r", "requestTimeout": "60s"},
        "backends": backends,
        "pools": pools,
        "modelGroups": groups,
        "rules": rules,
    }


def started(stack: Stack, routers: int = 1) -> Stack:
    stack.start_sims()
    stack.start_controller("c1")
    for _ in range(routers):
        stack.start_router()
    return stack


def placed(response: httpx.Response) -> tuple[str, str]:
    """(pool, reason) from ``x-hotseat-placement: gpu2; reason=...``."""
    pool, reason = response.headers["x-hotseat-placement"].split("; reason=")
    return pool, reason


async def settle(stack: Stack, residents: Mapping[str, str | None]) -> None:
    for pool, member in residents.items():
        await stack.wait_resident(member, pool=pool, timeout=30)


async def serving(stack: Stack, count: int) -> None:
    """Until ``count`` requests in all have started serving on the four GPUs."""

    async def started_serving() -> bool:
        total = 0
        for pool in POOLS:
            ledger = await stack.ledger(pool)
            total += sum(1 for e in ledger if e.event is LedgerEvent.SERVE_START)
        return total >= count

    await eventually(started_serving, timeout=30)


async def swaps_to(stack: Stack, member: str) -> list[dict[str, Any]]:
    """The swaps demand started to ``member`` (a pool warming its default is not one)."""
    events = await stack.settled_audit()
    return [
        e
        for e in events
        if e["outcome"] == "swap_started"
        and e.get("to_member") == member
        and e.get("reason") != "warm_default"
    ]


async def judged(stack: Stack) -> None:
    for pool in POOLS:
        await stack.judged_ledger(pool)


async def test_requests_spread_over_the_warm_copies(make_stack: Make) -> None:
    """assistant is warm on gpu0 and gpu1: overlapping requests alternate between them
    (fewest live leases first), and no cold pool loads it."""
    defaults = {"gpu0": "assistant", "gpu1": "assistant", "gpu2": "other", "gpu3": "other"}
    stack = started(make_stack(fleet_config(defaults=defaults)))
    await settle(stack, defaults)
    url = stack.routers[0].url
    tasks = []
    for k in range(4):
        tasks.append(asyncio.create_task(chat(url, "assistant", max_tokens=80)))
        await serving(stack, k + 1)  # each placement sees the leases of the ones before
    responses = await asyncio.gather(*tasks)
    assert [r.status_code for r in responses] == [200] * 4
    assert [placed(r) for r in responses] == [
        ("gpu0", "resident_least_busy"),
        ("gpu1", "resident_least_busy"),
        ("gpu0", "resident_least_busy"),
        ("gpu1", "resident_least_busy"),
    ]
    assert [r.headers["x-hotseat-backend"] for r in responses][:2] == [
        "gpu0-assistant",
        "gpu1-assistant",
    ]
    assert not await swaps_to(stack, "assistant")
    served = [
        e
        for e in await stack.settled_audit()
        if e["kind"] == "request" and e["rule"] == "assistant"
    ]
    assert Counter((e["pool"], e.get("placement")) for e in served) == {
        ("gpu0", "resident_least_busy"): 2,
        ("gpu1", "resident_least_busy"): 2,
    }
    # Status names the group's copies and its last placement, and why.
    async with httpx.AsyncClient(timeout=10) as client:
        listing = PoolList.model_validate_json(
            (await client.get(f"{stack.controller_url}/v1/pools")).content
        )
    [group] = listing.groups
    last_pool, last_reason = placed(responses[-1])
    assert (group.name, group.copies, group.loading) == ("assistant", ["gpu0", "gpu1"], [])
    assert (group.placed, group.reason) == (last_pool, last_reason)
    row = format_groups(listing.groups).splitlines()[1].split(None, 5)
    assert (row[0], row[1], row[2], row[5]) == (
        "assistant",
        "gpu0,gpu1",
        "-",
        f"placed: {last_pool}, reason: {last_reason}",
    )
    await judged(stack)


BURST_TOKENS = 1200
"""max_tokens of a burst's streams: a minute at the sims' 20 tokens/s, so every lease of
the burst is live until the test closes the streams."""


async def test_a_burst_spreads_evenly_over_the_warm_copies(make_stack: Make) -> None:
    """assistant warm on all four pools: as many requests at once as the copies have
    slots get exactly ``slots`` each, every one placed resident_least_busy (the choice and
    its count are one script, so requests placed at the same instant do not all see the
    same counts)."""
    slots = 3
    defaults = dict.fromkeys(POOLS, "assistant")
    stack = started(make_stack(fleet_config(defaults=defaults, slots=slots)))
    await settle(stack, defaults)
    url = stack.routers[0].url
    burst = slots * len(POOLS)
    done = asyncio.Event()
    placements: list[tuple[str, str]] = []

    async def one(client: httpx.AsyncClient) -> int:
        body = chat_body("assistant", BURST_TOKENS, stream=True)
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            if response.status_code == 200:
                placements.append(placed(response))
            await done.wait()
            return response.status_code

    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=burst)) as client:
        tasks = [asyncio.create_task(one(client)) for _ in range(burst)]

        async def answered() -> bool:
            return len(placements) == burst or any(t.done() for t in tasks)

        await eventually(answered, timeout=60)
        done.set()
        statuses = await asyncio.gather(*tasks)
    assert statuses == [200] * burst
    assert Counter(placements) == {(p, "resident_least_busy"): slots for p in POOLS}
    assert not await swaps_to(stack, "assistant")
    await judged(stack)


async def test_a_cold_model_loads_where_eviction_is_cheapest(make_stack: Make) -> None:
    """Every pool holds its own idle ``other``, each with a different measured load time:
    the cold assistant loads on the pool whose ``other`` reloads fastest (gpu2), not on
    the first pool."""
    defaults = dict.fromkeys(POOLS, "other")
    loads = {"gpu0": 2.5, "gpu1": 1.5, "gpu2": 0.2, "gpu3": 3.5}
    stack = started(make_stack(fleet_config(defaults=defaults, other_load_s=loads)))
    await settle(stack, defaults)
    response = await chat(stack.routers[0].url, "assistant")
    assert response.status_code == 200
    assert placed(response) == ("gpu2", "cold_cheapest_eviction")
    [swap] = await swaps_to(stack, "assistant")
    assert (swap["pool"], swap["from_member"]) == ("gpu2", "other")
    await judged(stack)


async def test_a_copy_beyond_demand_is_evicted_before_a_sole_copy(make_stack: Make) -> None:
    """assistant idle on gpu0 and gpu1 (two copies: either is beyond demand), ``other``
    (no copy elsewhere) idle on gpu2 and gpu3 and cheaper to reload than assistant. The
    cold coder evicts one of the assistant copies, not a cheap sole ``other``; assistant
    is still served from its other copy without a swap."""
    defaults = {"gpu0": "assistant", "gpu1": "assistant", "gpu2": "other", "gpu3": "other"}
    config = fleet_config(
        defaults=defaults, assistant_load_s=2.0, other_load_s=dict.fromkeys(POOLS, 0.2),
        max_copies=2, coder_load_s=0.3,
    )  # fmt: skip
    stack = started(make_stack(config))
    await settle(stack, defaults)
    response = await chat(stack.routers[0].url, "coder")
    assert response.status_code == 200, response.text
    pool, reason = placed(response)
    assert (pool in {"gpu0", "gpu1"}, reason) == (True, "cold_cheapest_eviction")
    [swap] = await swaps_to(stack, "coder")
    assert (swap["pool"], swap["from_member"]) == (pool, "assistant")
    kept = await chat(stack.routers[0].url, "assistant")
    assert kept.status_code == 200
    assert placed(kept) == ({"gpu0", "gpu1"}.difference({pool}).pop(), "resident_least_busy")
    assert not await swaps_to(stack, "assistant")
    await judged(stack)


async def test_fifty_requests_from_three_routers_start_one_swap(make_stack: Make) -> None:
    """50 concurrent requests for the cold assistant, from three routers, are all served
    by one copy: exactly one swap in the fleet (single flight)."""
    defaults = dict.fromkeys(POOLS, "other")
    stack = started(make_stack(fleet_config(defaults=defaults, assistant_load_s=1.5)), routers=3)
    await settle(stack, defaults)
    urls = [r.url for r in stack.routers]
    responses = await asyncio.gather(*(chat(urls[i % 3], "assistant") for i in range(50)))
    assert [r.status_code for r in responses] == [200] * 50, [r.text for r in responses][:3]
    pools = {placed(r)[0] for r in responses}
    assert len(pools) == 1, pools
    swaps = await swaps_to(stack, "assistant")
    assert [s["pool"] for s in swaps] == list(pools)
    await judged(stack)


async def test_demand_above_one_copys_slots_starts_a_second_copy(make_stack: Make) -> None:
    """slots 2, maxCopies 2, a 4 s load: the first two cold requests wait on one loading
    copy; the third finds it full and starts a second copy on another pool."""
    defaults = dict.fromkeys(POOLS, "other")
    config = fleet_config(defaults=defaults, slots=2, max_copies=2, assistant_load_s=4.0)
    stack = started(make_stack(config))
    await settle(stack, defaults)
    url = stack.routers[0].url
    tasks = []
    for k in range(3):
        tasks.append(asyncio.create_task(chat(url, "assistant")))
        await _held(stack, k + 1)
    responses = await asyncio.gather(*tasks)
    assert [r.status_code for r in responses] == [200] * 3
    first, second, third = (placed(r) for r in responses)
    assert first[1] == "cold_cheapest_eviction"
    assert second == (first[0], "joins_loading_copy")
    assert third[1] == "second_copy"
    assert third[0] != first[0]
    swaps = await swaps_to(stack, "assistant")
    assert sorted(s["pool"] for s in swaps) == sorted([first[0], third[0]])
    # The router's hold metrics count them as static backends' holds, under the pools
    # they were placed on; none is left counted as held.
    holds = {
        pool: await stack.metric(
            0,
            "hotseat_pool_hold_duration_seconds_count",
            {"pool": pool, "member": "assistant", "result": "granted"},
        )
        for pool in POOLS
    }
    assert holds == {pool: Counter([first[0], second[0], third[0]])[pool] for pool in POOLS}
    by_priority = await stack.metric(0, "hotseat_pool_hold_by_priority_seconds_count", {})
    assert by_priority == len(responses)
    assert await stack.metric(0, "hotseat_pool_held_requests", {}) == 0
    await judged(stack)


async def _held(stack: Stack, count: int) -> None:
    """Until ``count`` requests are held for assistant across the pools."""

    async def held() -> bool:
        total = 0
        for pool in POOLS:
            total += len(await stack.waiter_deadlines("assistant", pool=pool))
        return total >= count

    await eventually(held, timeout=20)


async def test_if_idle_falls_through_only_when_every_pool_is_busy(make_stack: Make) -> None:
    """IfIdle: with one pool's ``other`` idle the group loads assistant there; once all
    four pools serve their ``other`` it falls through to the rule's next backend (gpu0's
    other), audited as a busy skip of the group."""
    defaults = dict.fromkeys(POOLS, "other")
    stack = started(make_stack(fleet_config(defaults=defaults)))
    await settle(stack, defaults)
    url = stack.routers[0].url
    busy = [asyncio.create_task(chat(url, f"other-{p}", max_tokens=160)) for p in POOLS[:3]]
    await serving(stack, 3)
    one_idle = await chat(url, "assistant-ifidle")
    assert one_idle.status_code == 200
    assert placed(one_idle) == ("gpu3", "cold_cheapest_eviction")
    assert one_idle.headers["x-hotseat-backend"] == "gpu3-assistant"
    busy.append(asyncio.create_task(chat(url, "other-gpu3", max_tokens=160)))
    await serving(stack, 5)  # gpu3 swapped back to its other, which serves now
    every_busy = await chat(url, "assistant-ifidle")
    assert every_busy.status_code == 200
    assert every_busy.headers["x-hotseat-backend"] == "gpu0-other"
    assert "x-hotseat-placement" not in every_busy.headers
    assert [r.status_code for r in await asyncio.gather(*busy)] == [200] * 4
    skips = [
        e
        for e in await stack.settled_audit()
        if e["outcome"] == "busy_skip" and e.get("backend") == "assistant"
    ]
    assert len(skips) == 1
    await judged(stack)


async def copy_resident(stack: Stack, pool: str) -> bool:
    """The group index shows assistant resident on ``pool`` (what placement reads)."""
    client: aioredis.Redis = aioredis.from_url(stack.store_url, decode_responses=True)
    try:
        raw = await client.hget(Keys(stack.prefix).group_copies("assistant"), pool)
    finally:
        await client.aclose()
    return raw is not None and bool(orjson.loads(raw)["r"])


async def test_a_lost_pool_stops_receiving_placements(make_stack: Make) -> None:
    """Two controller replicas; assistant warm on gpu0, which serves slots - 1 streams;
    then made resident on gpu1 too (no lease: where the next request goes). gpu1's node
    goes (its sim killed) mid-flight. At once, before its pool's entry shows it, every
    request is served on gpu0 and at most one meets the dead node (the router re-places
    it, avoiding that pool, and reports the failure, which makes the controller check the
    resident). Once the entry shows it, none is placed on gpu1; then a controller replica
    is killed and the other places, still never on gpu1. (Every replica reads every pool,
    so a pool never loses its controller alone: with none left nothing is placed; a pool
    no replica has read for three idle ticks is not a candidate, test_placement.py.)"""
    slots = 4
    defaults = {"gpu0": "assistant", "gpu1": "other", "gpu2": "other", "gpu3": "other"}
    stack = started(make_stack(fleet_config(defaults=defaults, slots=slots, max_copies=2)))
    stack.start_controller("c2")
    await settle(stack, defaults)
    url = stack.routers[0].url

    async def gpu0_only(count: int) -> None:
        for _ in range(count):
            response = await chat(url, "assistant")
            assert response.status_code == 200, response.text
            assert placed(response)[0] == "gpu0"

    async with contextlib.AsyncExitStack() as streams:
        for _ in range(slots - 1):
            await streams.enter_async_context(live_stream(url, "assistant", BURST_TOKENS))
        assert len(await stack.lease_expiries("assistant", pool="gpu0")) == slots - 1
        auth = {"authorization": f"Bearer {stack.admin_token}"}
        async with httpx.AsyncClient(timeout=10) as client:
            swap = await client.post(
                f"{stack.controller_url}/v1/pools/gpu1/swap",
                json={"member": "assistant"},
                headers=auth,
            )
        assert swap.status_code == 200, swap.text
        await eventually(lambda: copy_resident(stack, "gpu1"), timeout=30)
        stack.sims["gpu1-assistant"].kill()
        await gpu0_only(3)
        # At most the first of them met the dead node: its failure was reported to the
        # controller (and the pool avoided), so none after it was placed there.
        tries = {"backend": "gpu1-assistant", "result": "connect"}
        assert await stack.metric(0, "hotseat_router_upstream_attempts_total", tries) <= 1

        async def gpu1_lost() -> bool:
            return not await copy_resident(stack, "gpu1")

        await eventually(gpu1_lost, timeout=30)
        await gpu0_only(3)
        stack.controllers["c1"].kill()
        await gpu0_only(3)


def capacity_fleet_config() -> dict[str, Any]:
    """Two capacity pools gpu0 and gpu1 of 24 GiB, each with ``assistant`` (8 GiB, a 2 s
    load), ``other`` (8 GiB, 0.2 s) and ``coder`` (14 GiB): the group ``assistant`` over
    both (two copies allowed), and a rule per backend (``gpuN-member``, Wait)."""
    pools = ("gpu0", "gpu1")
    members = {
        "assistant": {"memoryGiB": 8, "load": 2.0},
        "other": {"memoryGiB": 8, "load": 0.2},
        "coder": {"memoryGiB": 14, "load": 0.3},
    }
    names = [f"{p}-{m}" for p in pools for m in members]
    return {
        "router": {"name": "r", "requestTimeout": "60s"},
        "backends": [
            {
                "name": f"{p}-{m}",
                "address": f"http://127.0.0.1:{free_port()}",
                "pool": {"name": p, "member": m},
            }
            for p in pools
            for m in members
        ],
        "pools": [
            {
                "name": p,
                "swapBudget": "30s",
                "leaseTtl": "3s",
                "capacity": {"gpuMemoryGiB": 24},
                "driver": {"kind": "sim"},
                "members": [
                    {
                        "name": m,
                        "memoryGiB": spec["memoryGiB"],
                        "sim": {**SIM, "loadSeconds": spec["load"]},
                    }
                    for m, spec in members.items()
                ],
            }
            for p in pools
        ],
        "modelGroups": [
            {
                "name": "assistant",
                "maxCopies": 2,
                "members": [{"backend": f"{p}-assistant", "slots": 4} for p in pools],
            }
        ],
        "rules": [
            {"name": "assistant", "match": {"models": ["assistant"]},
             "route": {"backends": ["assistant"]}},
            *({"name": n, "match": {"models": [n]}, "route": {"backends": [n]}} for n in names),
        ],
    }  # fmt: skip


async def test_a_capacity_pool_evicts_a_copy_beyond_demand_before_a_sole_copy(
    make_stack: Make,
) -> None:
    """gpu0 holds assistant and other, gpu1 assistant: coder needs one of gpu0's gone.
    ADR 0008's order alone takes other (it reloads faster); assistant on gpu0 is a copy
    beyond demand (gpu1 holds it too), so gpu0's plan evicts it instead, and assistant
    is still served, on gpu1, without a swap."""
    stack = make_stack(capacity_fleet_config())
    stack.start_sims()
    stack.start_controller("c1")
    stack.start_router()
    url = stack.routers[0].url
    for model in ("gpu0-assistant", "gpu0-other", "gpu1-assistant"):
        response = await chat(url, model)
        assert response.status_code == 200, response.text

    async def two_copies() -> bool:
        async with httpx.AsyncClient(timeout=10) as client:
            body = (await client.get(f"{stack.controller_url}/v1/pools")).content
        [group] = PoolList.model_validate_json(body).groups
        return group.copies == ["gpu0", "gpu1"]

    await eventually(two_copies, timeout=30)
    response = await chat(url, "gpu0-coder")
    assert response.status_code == 200, response.text
    ledger = await stack.judged_ledger("gpu0")
    assert [e.member for e in ledger if e.event is LedgerEvent.UNLOAD_START] == ["assistant"]
    kept = await chat(url, "assistant")
    assert kept.status_code == 200
    assert placed(kept) == ("gpu1", "resident_least_busy")
    await stack.judged_ledger("gpu1")


async def test_a_copy_that_answers_5xx_is_avoided_and_the_request_served_on_another(
    make_stack: Make,
) -> None:
    """assistant warm on gpu0 and gpu1; gpu0's copy answers 500 to these requests (the
    sim's ``x-sim-status: gpu0-assistant=500``). Each request is placed on gpu0 first
    (equal copies: the pool name decides), fails there, and the router places it again
    avoiding gpu0: it is served on gpu1 (without ``avoid`` the group would place it on
    gpu0 again, each time, and answer 502)."""
    defaults = {"gpu0": "assistant", "gpu1": "assistant", "gpu2": "other", "gpu3": "other"}
    stack = started(make_stack(fleet_config(defaults=defaults)))
    await settle(stack, defaults)
    url = stack.routers[0].url
    body = chat_body("assistant", 4)
    async with httpx.AsyncClient(timeout=60) as client:
        for k in range(2):
            response = await client.post(
                f"{url}/v1/chat/completions",
                json=body,
                headers={"x-sim-status": "gpu0-assistant=500", "x-hotseat-request-id": f"r{k}"},
            )
            assert response.status_code == 200, response.text
            assert placed(response) == ("gpu1", "resident_least_busy")
            assert response.headers["x-hotseat-backend"] == "gpu1-assistant"
        failed = (await client.get(f"{stack.sims['gpu0-assistant'].url}/debug/requests")).json()
    assert len(failed["requests"]) == 2, "each request was tried on gpu0 first"
    served = [
        e
        for e in await stack.settled_audit()
        if e["kind"] == "request" and e["rule"] == "assistant"
    ]
    assert sorted((e["request_id"], e["pool"], e["outcome"]) for e in served) == [
        ("r0", "gpu1", "served"),
        ("r1", "gpu1", "served"),
    ]
    await judged(stack)


async def test_a_cold_burst_puts_at_most_slots_waiters_on_a_loading_copy(
    make_stack: Make,
) -> None:
    """slots 2, maxCopies 2, a 3 s load, assistant cold everywhere: four requests at
    once wait on two loading copies, two each (joining a loading copy counts the request
    there in the same script that checks its slots, so the burst does not pile onto the
    first copy before the second is claimed)."""
    defaults = dict.fromkeys(POOLS, "other")
    config = fleet_config(defaults=defaults, slots=2, max_copies=2, assistant_load_s=3.0)
    stack = started(make_stack(config))
    await settle(stack, defaults)
    url = stack.routers[0].url
    responses = await asyncio.gather(*(chat(url, "assistant") for _ in range(4)))
    assert [r.status_code for r in responses] == [200] * 4
    by_pool = Counter(placed(r)[0] for r in responses)
    assert sorted(by_pool.values()) == [2, 2], by_pool
    swaps = await swaps_to(stack, "assistant")
    assert sorted(s["pool"] for s in swaps) == sorted(by_pool)
    await judged(stack)
