"""Fault tests: the controllers' Redis blackholed, and restarted empty (guarantees 5 and 6
of docs/reliability.md). The sims keep their GPU ledger on another Redis, so the oracle
sees the truth whatever happens to the controllers' store."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis

from hotseat.launcher import Managed, free_port, start_redis
from hotseat_common.keys import Keys
from tests.fault.conftest import MakeFaultStack, StartProxy
from tests.support.clients import chat, live_stream
from tests.support.faultstack import FaultStack
from tests.support.procs import kill
from tests.support.stack import pool_stack_config
from tests.support.waiting import eventually

pytestmark = pytest.mark.fault

OUTAGE_S = 3.0


def with_unpooled(pool: dict[str, Any]) -> dict[str, Any]:
    plain = {"name": "plain", "address": f"http://127.0.0.1:{free_port()}"}
    config = pool_stack_config(pool=pool, extra_backends=[plain])
    config["rules"].append(
        {"name": "plain", "match": {"models": ["plain"]}, "route": {"backends": ["plain"]}}
    )
    return config


async def _loads_since(stack: FaultStack, since: float) -> list[Any]:
    return [e for e in await stack.ledger() if e.event == "load_start" and e.time >= since]


async def test_redis_blackholed_fails_closed_and_fast(
    make_stack: MakeFaultStack, proxies: StartProxy
) -> None:
    """The controllers' Redis blackholed: no grant and no swap while it lasts (fail
    closed), pooled requests get 503 with Retry-After as soon as the store probe fails
    (controller_unavailable, not a hold until the swap budget), a stream already in flight
    finishes cleanly, and an unpooled backend keeps serving; once Redis is back, the pool
    serves and swaps again. The one exception: a judge request may share the lease the
    in-flight stream holds on the same router while that lease is proven valid (judge
    stays resident until it expires, and nobody can swap it meanwhile); once the stream
    has released it, judge requests fail closed too."""
    stack = make_stack(with_unpooled({"leaseTtl": "6s", "swapBudget": "20s"}))
    proxy = proxies(int(stack.redis_url.rsplit(":", 1)[1].split("/")[0]))
    stack.controller_redis_url = proxy.url("redis", "/0")
    stack.start_sims()
    stack.start_controller("c1")
    stack.start_controller("c2")
    router = stack.start_router()
    await stack.wait_resident("judge")
    assert (await chat(router.url, "judge")).status_code == 200
    async with live_stream(router.url, "judge", max_tokens=50) as stream:  # 2.5 s at 20 tok/s
        proxy.blackhole()
        dark = time.time()
        dark_mono = time.monotonic()
        answers: list[tuple[str, int, str | None, str | None]] = []
        while time.monotonic() - dark_mono < OUTAGE_S:  # the outage lasts this long
            for model in ("judge", "coder", "plain"):
                response = await chat(router.url, model, timeout=30)
                answers.append(_answer(model, response))
            await asyncio.sleep(0.1)  # pacing: a few rounds of requests during the outage
        result = await stream
        after_stream = await chat(router.url, "judge", timeout=30)
        answers.append(_answer("judge", after_stream))
        proxy.pass_()
    assert result.clean, result
    assert after_stream.status_code == 503, after_stream.text
    assert after_stream.headers.get("retry-after")
    pooled = [a for a in answers if a[0] != "plain"]
    assert pooled, answers
    refused = [a for a in pooled if a[0] == "coder" or a[1] != 200]
    assert all(status == 503 and retry for _, status, _, retry in refused), pooled
    # Answered by the failed store probe, not held until the 20 s swap budget ran out
    # (that answer would be pool_activation_timeout).
    assert {code for _, _, code, _ in refused} == {"controller_unavailable"}, pooled
    assert all(a[0] == "judge" for a in pooled if a[1] == 200), pooled  # shared lease only
    assert all(status == 200 for model, status, _, _ in answers if model == "plain"), answers
    assert await _loads_since(stack, dark) == []
    # Back to normal: once every controller has seen the store answer again (a replica
    # whose probe has not yet run still fails closed), the resident serves and a swap runs.
    await eventually(lambda: _controllers_ready(stack), timeout=10, interval=0.1)
    await eventually(lambda: _serves(router.url, "judge"), timeout=10, interval=0.2)
    swapped = await chat(router.url, "coder")
    assert swapped.status_code == 200, swapped.text
    assert swapped.headers["x-hotseat-backend"] == "coder"
    await stack.assert_invariants()


def _answer(model: str, response: httpx.Response) -> tuple[str, int, str | None, str | None]:
    """(model, status, error code, Retry-After) of one answer."""
    code = response.json()["error"]["code"] if response.status_code != 200 else None
    return model, response.status_code, code, response.headers.get("retry-after")


async def _controllers_ready(stack: FaultStack) -> bool:
    async with httpx.AsyncClient(timeout=2) as client:
        for controller in stack.controllers.values():
            if (await client.get(f"{controller.url}/readyz")).status_code != 200:
                return False
    return True


async def _serves(url: str, model: str) -> bool:
    return (await chat(url, model)).status_code == 200


async def _judge_resident_on(
    make_stack: MakeFaultStack, redis_url: str
) -> tuple[FaultStack, Managed]:
    """A stack whose controller keeps its pools on ``redis_url``, with judge resident, and
    its router."""
    stack = make_stack(pool_stack_config(pool={"leaseTtl": "3s"}))
    stack.controller_redis_url = redis_url
    stack.start_sims()
    stack.start_controller("c1")
    router = stack.start_router()
    await stack.wait_resident("judge")
    return stack, router


async def test_redis_restarted_empty_rederives_residency_before_granting(
    make_stack: MakeFaultStack, tmp_path: Path
) -> None:
    """The controllers' Redis restarts empty: the controller rebuilds the pool from what
    the drivers report before it grants anything (the resident keeps serving without a
    reload, under a new epoch), and later swaps still never overlap."""
    port = free_port()
    ctl_redis = start_redis(tmp_path / "ctl-redis", port=port)
    try:
        stack, router = await _judge_resident_on(make_stack, ctl_redis.url)
        assert (await chat(router.url, "judge")).status_code == 200
        epoch_before = int((await stack.state_hash())["epoch"])
        kill(ctl_redis)
        ctl_redis = await asyncio.to_thread(start_redis, tmp_path / "ctl-redis", port=port)
        restarted = time.time()
        async with live_stream(router.url, "judge", max_tokens=40) as stream:
            state = await stack.state_hash()
            assert state["resident"] == "judge", state
            assert int(state["epoch"]) > epoch_before
            granted = await _lease_epochs(ctl_redis.url, stack.prefix)
            assert granted, "the stream holds no lease"
            assert all(e == int(state["epoch"]) for e in granted), (granted, state)
            result = await stream
        assert result.clean, result
        assert await _loads_since(stack, restarted) == [], "the resident was loaded again"
        swapped = await chat(router.url, "coder")
        assert swapped.status_code == 200, swapped.text
        assert swapped.headers["x-hotseat-backend"] == "coder"
        await stack.assert_invariants()
        log = "\n".join(p.log_text() for p in stack.controllers.values())
        assert "pool_state_rebuilt" in log
    finally:
        ctl_redis.stop()


async def _lease_epochs(url: str, prefix: str) -> list[int]:
    """The epochs recorded with every lease of the pool."""
    client: aioredis.Redis = aioredis.from_url(url, decode_responses=True)
    try:
        metas = await client.hvals(Keys(prefix).pool_lease_meta("gpu0"))
    finally:
        await client.aclose()
    return [int(orjson.loads(m)["epoch"]) for m in metas]


SWAP_ENDS = ("swap_completed", "swap_failed", "swap_cancelled")


async def test_a_swap_the_store_lost_mid_load_is_ended_once_in_the_audit(
    make_stack: MakeFaultStack, tmp_path: Path
) -> None:
    """The controllers' Redis restarts empty while a swap loads (the sim holds the load):
    the pool is rebuilt from what the members report, and the swap's owner, whose claim
    still held, ends the swap in the audit: one ``swap_cancelled`` with ``reason:
    pool_state_lost`` after its ``swap_started``, and no other end (docs/adr/0005,
    point 9). The request that waited for the swap is answered."""
    port = free_port()
    ctl_redis = start_redis(tmp_path / "ctl-redis", port=port)
    try:
        stack, router = await _judge_resident_on(make_stack, ctl_redis.url)
        await stack.hold_sim("coder", "loading")
        waiting = asyncio.create_task(chat(router.url, "coder"))
        (started,) = await stack.wait_audit(
            lambda e: e["outcome"] == "swap_started" and e.get("to_member") == "coder"
        )

        async def loading() -> bool:
            return (await stack.state_hash()).get("phase") == "loading"

        await eventually(loading, timeout=15)
        kill(ctl_redis)
        ctl_redis = await asyncio.to_thread(start_redis, tmp_path / "ctl-redis", port=port)
        (end,) = await stack.wait_audit(
            lambda e: e.get("swap_id") == started["swap_id"] and e["outcome"] in SWAP_ENDS,
            timeout=30,
        )
        assert (end["outcome"], end["reason"]) == ("swap_cancelled", "pool_state_lost"), end
        await stack.hold_sim("coder")  # the load the swap began finishes
        answer = await asyncio.wait_for(waiting, timeout=60)
        assert answer.status_code == 200 or "retry-after" in answer.headers, answer.text
        events = await stack.settled_audit()
        ends = [e for e in events if e["kind"] == "pool" and e.get("swap_id") == started["swap_id"]]
        assert [e["outcome"] for e in ends] == ["swap_started", "swap_cancelled"], ends
        log = "\n".join(p.log_text() for p in stack.controllers.values())
        assert "swap_lost_with_state" in log
    finally:
        ctl_redis.stop()
