"""A busy member is never cut: one test per way the first controller broke that promise
(docs/adr/0005-busy-is-never-cut.md, docs/reliability.md guarantees 18 to 25).

Real sims, controllers and routers, real NATS and Redis; the sims keep their ledger on the
session's Redis, so the full verdict (no overlap, no member unloaded while serving, no
request cut) sees the truth whatever a test does to the controllers' store.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from hotseat.launcher import Managed, free_port, start_redis
from hotseat_common.config.model import PoolActivation
from hotseat_common.connections import open_nats
from hotseat_common.messages import (
    ACQUIRE_REPLY,
    Ack,
    AcquireRequest,
    CancelRequest,
    Granted,
    ReleaseRequest,
)
from hotseat_common.subjects import Subjects
from tests.fault.conftest import MakeFaultStack, StartProxy
from tests.support.clients import chat, live_stream
from tests.support.faketime import faketime_env
from tests.support.faultstack import FaultStack
from tests.support.procs import frozen, kill
from tests.support.stack import eventually, pool_stack_config

pytestmark = pytest.mark.fault


async def live_leases(stack: FaultStack, member: str) -> int:
    return int((await stack.pool())["leases"][member])


def started(stack: FaultStack, *, routers: int = 1, controllers: int = 1) -> FaultStack:
    stack.start_sims()
    for n in range(controllers):
        stack.start_controller(f"c{n + 1}")
    for _ in range(routers):
        stack.start_router()
    return stack


# --- 1: a client's request id is never a lease key ---------------------------------------


async def test_two_requests_with_one_client_id_hold_two_leases(make_stack: MakeFaultStack) -> None:
    """Two requests carrying the same ``x-hotseat-request-id`` through two routers: when
    the short one ends, the long stream still keeps judge busy, a Wait request for coder
    waits for it instead of swapping judge away, and no request is cut."""
    stack = started(make_stack(pool_stack_config(pool={"leaseTtl": "3s"})), routers=2)
    first, second = stack.routers
    await stack.wait_resident("judge")
    async with live_stream(first.url, "judge", max_tokens=60, request_id="same-id") as stream:
        short = await chat(second.url, "judge", request_id="same-id")
        assert short.status_code == 200, short.text
        assert await live_leases(stack, "judge") >= 1, "the stream's lease went with the other"
        held = asyncio.create_task(chat(second.url, "coder", timeout=60))
        result = await stream
    answer = await held
    await stack.assert_invariants()  # the oracle first: no request cut, none unloaded
    assert result.clean, result
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-hotseat-backend"] == "coder"


# --- 2: busy is re-learned after Redis lost its state -------------------------------------


async def test_a_stream_survives_redis_restarting_empty(
    make_stack: MakeFaultStack, tmp_path: Path
) -> None:
    """The controllers' Redis restarts empty under a stream on judge: the stream runs to
    its end (its renewals are adopted back), and a Wait request for coder that arrives
    after the rebuild waits for it instead of unloading judge under it."""
    port = free_port()
    ctl_redis = start_redis(tmp_path / "ctl-redis", port=port)
    try:
        stack = make_stack(pool_stack_config(pool={"leaseTtl": "2s"}))
        stack.controller_redis_url = ctl_redis.url
        started(stack)
        router = stack.routers[0]
        await stack.wait_resident("judge")
        async with live_stream(router.url, "judge", max_tokens=80) as stream:  # 4 s
            kill(ctl_redis)
            ctl_redis = await asyncio.to_thread(start_redis, tmp_path / "ctl-redis", port=port)
            await eventually(lambda: _rebuilt(stack), timeout=20, interval=0.05)
            held = asyncio.create_task(chat(router.url, "coder", timeout=60))
            result = await stream
        answer = await held
        await stack.assert_invariants()
        assert result.clean, result
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-hotseat-backend"] == "coder"
    finally:
        ctl_redis.stop()


async def _rebuilt(stack: FaultStack) -> bool:
    state = await stack.state_hash()
    return state.get("phase") in {"idle", "draining"} and state.get("resident") == "judge"


# --- 3: one clock ------------------------------------------------------------------------


async def test_a_router_whose_clock_is_behind_is_held_and_served(
    make_stack: MakeFaultStack,
) -> None:
    """A router whose wall clock runs 120 s behind (more than the 30 s swap budget) holds a
    Wait request for coder through one swap and is served by coder."""
    stack = make_stack(pool_stack_config())
    stack.start_sims()
    stack.start_controller("c1")
    router = stack.start_router(**faketime_env("-120s"))
    await stack.wait_resident("judge")
    answer = await chat(router.url, "coder", timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-hotseat-backend"] == "coder"
    swaps = [
        e
        for e in await stack.settled_audit()
        if e["outcome"] in {"swap_started", "swap_cancelled"} and e.get("to_member") == "coder"
    ]
    assert [e["outcome"] for e in swaps] == ["swap_started"], swaps
    await stack.assert_invariants()


# --- 4: recovery never unloads a member with live leases ----------------------------------


async def test_a_stalled_resident_under_a_stream_is_not_unloaded(
    make_stack: MakeFaultStack,
) -> None:
    """judge stops answering (SIGSTOP) in the middle of a stream, long enough to fail
    several health checks: while the stream's lease lives it is not unloaded, a Wait
    request for coder is held; once judge answers again, the stream ends cleanly and
    only then does the swap run."""
    # No default member: once judge is taken for lost, nothing brings it back before the
    # swap to coder (which is what would cut the stream).
    stack = started(make_stack(pool_stack_config(pool={"leaseTtl": "2s", "default": None})))
    router = stack.routers[0]
    assert (await chat(router.url, "judge")).status_code == 200
    await stack.wait_resident("judge")
    # Longer than the freeze (two health checks that time out: about 11 s).
    async with live_stream(router.url, "judge", max_tokens=400) as stream:  # 20 s at 20 tok/s
        with frozen(stack.sims["judge"]):
            await eventually(lambda: _health_failed(stack), timeout=20, interval=0.1)
            held = asyncio.create_task(chat(router.url, "coder", timeout=90))
            await eventually(lambda: _coder_waits(stack), timeout=20, interval=0.05)
        result = await stream
    answer = await held
    await stack.assert_invariants()
    assert result.clean, result
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-hotseat-backend"] == "coder"


async def _health_failed(stack: FaultStack) -> bool:
    """The controller noticed: judge marked unhealthy, or (the old way) declared lost."""
    log = "\n".join(p.log_text() for p in stack.controllers.values())
    return "resident_unhealthy" in log or "resident_lost" in log


async def _coder_waits(stack: FaultStack) -> bool:
    state = await stack.state_hash()
    return state.get("target") == "coder" or state.get("phase") in {"unloading", "loading"}


# --- 5: a cancel names its member ----------------------------------------------------------


async def test_a_cancel_touches_only_the_member_it_names(
    make_stack: MakeFaultStack, nats_server: Managed
) -> None:
    """An attempt granted a lease on judge, then cancelled on coder (the busy skip before
    it), keeps its judge lease: asked again it gets the same lease, and once released no
    lease is left behind to keep judge busy."""
    stack = make_stack(pool_stack_config(pool={"leaseTtl": "30s"}))
    stack.start_sims()
    stack.start_controller("c1")
    await stack.wait_resident("judge")
    subjects = Subjects(stack.prefix)
    nc = await open_nats(nats_server.url, connect_timeout=2)
    try:

        async def acquire(member: str) -> Any:
            ask = AcquireRequest(
                pool="gpu0",
                member=member,
                mode=PoolActivation.IF_IDLE,
                attempt="attempt-1",
                request_id="client-1",
                router="scripted",
                hold_s=10,
            )
            reply = await nc.request(subjects.acquire, ask.to_bytes(), timeout=5)
            return ACQUIRE_REPLY.validate_json(reply.data)

        granted = await acquire("judge")
        assert isinstance(granted, Granted), granted
        cancel = CancelRequest(pool="gpu0", member="coder", attempt="attempt-1")
        Ack.from_bytes((await nc.request(subjects.cancel, cancel.to_bytes(), timeout=5)).data)
        again = await acquire("judge")
        assert isinstance(again, Granted), again
        assert again.lease_id == granted.lease_id, "a second lease for the same attempt"
        release = ReleaseRequest(pool="gpu0", member="judge", lease_id=again.lease_id)
        await nc.request(subjects.release, release.to_bytes(), timeout=5)
        assert await live_leases(stack, "judge") == 0
    finally:
        await nc.close()
    await stack.assert_invariants()


# --- 6: a load that started finishes ---------------------------------------------------


async def test_a_takeover_during_loading_finishes_the_load(make_stack: MakeFaultStack) -> None:
    """The swap's owner is SIGKILLed while coder loads and its only waiter has left: the
    replica that takes over loads coder to completion (no unload of coder once its load
    began), and coder becomes the resident."""
    config = pool_stack_config(coder={"loadSeconds": 3.0})
    stack = started(make_stack(config), controllers=2)
    router = stack.routers[0]
    await stack.wait_resident("judge")
    request = asyncio.create_task(chat(router.url, "coder", timeout=60))
    await eventually(lambda: _phase(stack, "loading"), timeout=20, interval=0.02)
    request.cancel()
    await eventually(lambda: _no_waiters(stack), timeout=10, interval=0.02)
    owner = (await stack.state_hash())["owner"]
    kill(stack.controllers[owner])
    await stack.wait_resident("coder", timeout=30)
    timeline = await stack.ledger()
    coder_starts = [e for e in timeline if e.member == "coder" and e.event == "load_start"]
    coder_unloads = [e for e in timeline if e.member == "coder" and e.event == "unload_start"]
    assert len(coder_starts) == 1, coder_starts
    assert coder_unloads == [], coder_unloads
    await stack.assert_invariants()


async def _phase(stack: FaultStack, phase: str) -> bool:
    return (await stack.state_hash()).get("phase") == phase


async def _no_waiters(stack: FaultStack) -> bool:
    return sum((await stack.pool())["waiters"].values()) == 0


# --- 7: no IfIdle request is held for nothing ------------------------------------------------


def _three_member_config(**pool: Any) -> dict[str, Any]:
    """judge (resident), coder (a Wait target) and writer (asked IfIdle) on one GPU."""
    config = pool_stack_config(pool={"busySignal": "leasesAndSlots", **pool})
    writer_port = free_port()
    config["backends"].append(
        {
            "name": "writer",
            "address": f"http://127.0.0.1:{writer_port}",
            "pool": {"name": "gpu0", "member": "writer"},
        }
    )
    config["pools"][0]["members"].append(
        {
            "name": "writer",
            "sim": {"loadSeconds": 0.3, "unloadSeconds": 0.1, "memoryGiB": 4, "slots": 4},
        }
    )
    config["rules"].append(
        {
            "name": "writer-ifidle",
            "match": {"models": ["writer-ifidle"]},
            "route": {"backends": ["writer"], "poolActivation": "IfIdle"},
        }
    )
    return config


async def test_an_if_idle_request_is_not_held_through_a_swap_for_another_member(
    make_stack: MakeFaultStack,
) -> None:
    """The pool drains from judge toward coder's waiter; judge's own traffic ends; an IfIdle
    request for writer then gets its answer at once (the pool is committed to coder)
    instead of being held through coder's swap only to be skipped at its end."""
    stack = make_stack(_three_member_config(), extra_env={"HOTSEAT_TICK_INTERVAL": "3"})
    started(stack)
    router = stack.routers[0]
    await stack.wait_resident("judge", timeout=30)
    judge_url = next(b["address"] for b in stack.config["backends"] if b["name"] == "judge")
    # Traffic that bypasses the router keeps judge's /slots busy: the pool drains.
    async with live_stream(judge_url, "judge", max_tokens=30) as direct:
        held = asyncio.create_task(chat(router.url, "coder", timeout=60))
        await eventually(lambda: _draining_to(stack, "coder"), timeout=10, interval=0.02)
        assert (await direct).clean
    asked = time.monotonic()
    answer = await chat(router.url, "writer-ifidle", timeout=60)
    answered = time.monotonic()
    still = await stack.pool()
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "pool_incumbent_busy"
    assert still["resident"] != "coder", (
        f"writer's IfIdle request was held {answered - asked:.1f}s, through coder's swap"
    )
    served = await held
    assert served.status_code == 200, served.text
    await stack.assert_invariants()


async def _draining_to(stack: FaultStack, target: str) -> bool:
    state = await stack.state_hash()
    return state.get("phase") == "draining" and state.get("target") == target


async def test_a_request_is_never_skipped_because_of_its_own_lease(
    make_stack: MakeFaultStack, proxies: StartProxy
) -> None:
    """A request whose first backend (judge) fails releases its lease before it asks for
    the next member of the same pool (coder, IfIdle): with two controllers, one of them
    behind a slow link, coder is never skipped as busy because of the request's own
    judge lease; every request is served by coder."""
    config = pool_stack_config(
        judge={"loadSeconds": 0.05, "unloadSeconds": 0.02},
        coder={"loadSeconds": 0.05, "unloadSeconds": 0.02},
        rules=[
            {
                "name": "judge-then-coder",
                "match": {"models": ["either"]},
                "route": {"backends": ["judge", "coder"], "poolActivation": "IfIdle"},
            }
        ],
    )
    config["router"]["quarantine"] = "0.001s"  # every request tries judge again
    stack = make_stack(config)
    slow = proxies(int(stack.nats_url.rsplit(":", 1)[1]))
    slow.latency(0.15)
    stack.start_sims()
    stack.start_controller("c1")
    stack.start_controller("c2", nats_url=slow.url("nats"))
    router = stack.start_router()
    await stack.wait_resident("judge")
    outcomes: list[tuple[int, str | None]] = []
    async with httpx.AsyncClient(timeout=60) as client:
        for n in range(12):
            response = await client.post(
                f"{router.url}/v1/chat/completions",
                json={"model": "either", "messages": [{"role": "user", "content": "hi"}]},
                headers={"x-sim-status": "judge=500", "x-hotseat-request-id": f"own-{n}"},
            )
            outcomes.append((response.status_code, response.headers.get("x-hotseat-backend")))
    assert outcomes == [(200, "coder")] * 12, outcomes
    skips = [e for e in await stack.settled_audit() if e["outcome"] == "busy_skip"]
    # judge may be skipped when the previous request's coder lease is still being released
    # (that is IfIdle doing its job); coder must never be skipped for the request's own.
    own = [(e["request_id"], e["member"]) for e in skips if e["member"] == "coder"]
    assert own == [], own
    await stack.assert_invariants()
