"""The activation contract with real ``llama-server`` members: real controller and router
processes, real NATS and Redis, a ``process`` pool of two servers judged busy by leases and
their real ``/slots``."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.realserver.conftest import Llama
from tests.realserver.support import (
    MEMBERS,
    Watcher,
    alive,
    at,
    chat,
    hanging,
    llama_config,
    log_events,
    pid_of,
    port_of,
    port_open,
    slots_busy,
    streaming,
)
from tests.support.audit_trail import event_time
from tests.support.stack import Stack
from tests.support.waiting import eventually

pytestmark = pytest.mark.realserver

Make = Callable[[dict[str, Any]], Stack]
POOL = "cpu0"
LONG = 1900
"""Tokens of a stream that keeps the large member busy for far longer than any step of a
test (about 10 s here; a slot holds 2048 tokens of context)."""


async def started(make_stack: Make, config: dict[str, Any]) -> Stack:
    stack = make_stack(config)
    stack.start_controller("c1")
    stack.start_router()
    await stack.wait_resident(config["pools"][0]["default"], pool=POOL, timeout=60)
    return stack


def member_url(config: dict[str, Any], member: str) -> str:
    return f"http://127.0.0.1:{port_of(config, member)}"


def controller_log(stack: Stack, *events: str) -> list[dict[str, Any]]:
    return log_events(stack.controllers["c1"].log_text(), *events)


async def waiters(stack: Stack, member: str) -> bool:
    return bool((await stack.pool(POOL))["waiters"].get(member, 0) > 0)


async def test_held_request_streams_from_the_new_member_once_the_old_one_is_gone(
    make_stack: Make, llama: Llama, tmp_path: Path
) -> None:
    """Small resident; a streaming request for large through the OpenAI SDK is held while
    small's process is stopped (pid and port gone) and only then large's starts, and is
    streamed by large; an independent watcher never sees both servers at once."""
    data = tmp_path / "members"
    config = llama_config(llama, data)
    stack = await started(make_stack, config)
    small_pid = pid_of(data, "small")
    assert small_pid is not None
    watcher = Watcher(stack.controllers["c1"].pid, {m: port_of(config, m) for m in MEMBERS})
    watcher.start()
    client = openai.AsyncOpenAI(
        base_url=f"{stack.routers[0].url}/v1", api_key="unused", max_retries=0, timeout=90
    )
    requested_at = time.time()
    async with client.chat.completions.with_streaming_response.create(
        model="large",
        messages=[{"role": "user", "content": "hello world"}],
        max_tokens=24,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    ) as response:
        backend = response.headers["x-hotseat-backend"]
        first_chunk_at = None
        chunks = []
        async for chunk in await response.parse():
            first_chunk_at = first_chunk_at or time.time()
            chunks.append(chunk)
    await client.close()
    await watcher.wait_seen("large")
    await watcher.stop()

    assert backend == "large"
    assert chunks[-1].choices[0].finish_reason == "length"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert {c.model for c in chunks} == {"tiny-large"}  # llama-server names its model
    # The old process and its port were gone before the new one started.
    assert not alive(small_pid)
    assert not port_open(port_of(config, "small"))
    [stopped] = [
        e for e in controller_log(stack, "process_member_stopped") if e["member"] == "small"
    ]
    [start] = [e for e in controller_log(stack, "process_member_started") if e["member"] == "large"]
    assert stopped["pid"] == small_pid
    assert at(stopped) <= at(start)
    assert watcher.overlaps() == []
    # The request was held through the swap: it came first, its first chunk after the commit.
    events = await stack.settled_audit()
    [swap_start] = [
        e for e in events if e["outcome"] == "swap_started" and e.get("to_member") == "large"
    ]
    [swap_done] = [
        e for e in events if e["outcome"] == "swap_completed" and e.get("to_member") == "large"
    ]
    assert requested_at <= event_time(swap_start) <= event_time(swap_done)
    assert first_chunk_at is not None
    assert first_chunk_at >= event_time(swap_done)
    served = [e for e in events if e["kind"] == "request" and e.get("backend") == "large"]
    assert [e["outcome"] for e in served] == ["served"]
    swap_s = event_time(swap_done) - event_time(swap_start)
    print(f"\nreal swap small -> large: {swap_s * 1000:.0f} ms")


async def test_forced_swap_from_a_hung_member_loads_the_next_only_once_it_is_killed(
    make_stack: Make, llama: Llama, tmp_path: Path
) -> None:
    """An admin swap from small to large while requests that bypassed the router run on
    small (a stream, and a plain request that makes its SIGTERM hang certain): small is
    SIGKILLed after stopGracePeriod, and large's process starts only after small's
    process and port are gone (seen by an independent watcher)."""
    data = tmp_path / "members"
    config = llama_config(llama, data, grace="2s")
    stack = await started(make_stack, config)
    small_pid = pid_of(data, "small")
    assert small_pid is not None
    watcher = Watcher(stack.controllers["c1"].pid, {m: port_of(config, m) for m in MEMBERS})
    watcher.start()
    admin = {"authorization": f"Bearer {stack.admin_token}"}
    async with (
        streaming(member_url(config, "small"), "small", max_tokens=LONG) as stream,
        hanging(member_url(config, "small"), port_of(config, "small"), "small"),
        httpx.AsyncClient(timeout=5, trust_env=False) as client,
    ):
        began = time.monotonic()
        forced = await client.post(
            f"{stack.controller_url}/v1/pools/{POOL}/swap",
            json={"member": "large", "force": True},  # small's /slots is busy on purpose
            headers=admin,
        )
        assert forced.status_code == 200, forced.text
        await stack.wait_resident("large", pool=POOL, timeout=30)
        elapsed = time.monotonic() - began
        result = await stream.task
    first_large = await watcher.wait_seen("large")
    await watcher.stop()
    assert not result.finished, result
    assert elapsed >= 2.0, "small stopped before the grace period: it did not hang"
    assert watcher.overlaps() == []
    assert not any(s.pids["small"] or s.open_ports["small"] for s in watcher.samples
                   if s.time >= first_large.time)  # fmt: skip
    [killed] = controller_log(stack, "process_member_killed")
    [start] = [e for e in controller_log(stack, "process_member_started") if e["member"] == "large"]
    assert killed["pid"] == small_pid
    assert at(killed) < at(start)
    assert not alive(small_pid)


@pytest.mark.parametrize("via", ["router", "direct"])
async def test_if_idle_skips_a_member_whose_real_slot_is_busy(
    make_stack: Make, llama: Llama, tmp_path: Path, via: str
) -> None:
    """IfIdle: large resident and generating (through the router, holding a lease, or
    straight to its llama-server, seen only in its real /slots): a [small, large] request
    skips small at once (busy_skip) and large serves it; small is never started."""
    data = tmp_path / "members"
    config = llama_config(llama, data, pool={"default": "large"})
    config["rules"][0]["route"]["backends"] = ["small", "large"]
    stack = await started(make_stack, config)
    router = stack.routers[0].url
    target = router if via == "router" else member_url(config, "large")
    async with streaming(target, "large", max_tokens=LONG) as stream:
        assert await slots_busy(port_of(config, "large"))
        response = await chat(router, "either", request_id=f"ifidle-{via}")
        # Held, it would have been answered only after the stream (and small's start).
        assert not stream.task.done(), "answered after large's stream: not skipped"
    assert response.status_code == 200, response.text
    assert response.headers["x-hotseat-backend"] == "large"
    events = await stack.settled_audit()
    skips = [e for e in events if e["outcome"] == "busy_skip"]
    assert [(e["request_id"], e["member"]) for e in skips] == [(f"ifidle-{via}", "small")]
    swaps = [e for e in events if e["outcome"] == "swap_started"]
    assert [e.get("to_member") for e in swaps] == ["large"]  # the warm-up only
    assert pid_of(data, "small") is None
    assert controller_log(stack, "process_member_killed") == []


@pytest.mark.parametrize("via", ["router", "direct"])
async def test_wait_holds_until_the_real_slot_drains_then_swaps_gracefully(
    make_stack: Make, llama: Llama, tmp_path: Path, via: str
) -> None:
    """Wait: large generating (through the router, or straight to it: only its real /slots
    tell) holds a request for small until large's stream has ended in full; then large
    stops on SIGTERM alone (drained first: no SIGKILL) and small serves the held request."""
    data = tmp_path / "members"
    config = llama_config(llama, data, pool={"default": "large"})
    stack = await started(make_stack, config)
    router = stack.routers[0].url
    target = router if via == "router" else member_url(config, "large")
    # A stream far longer than the hold takes to register, even on a loaded machine (a
    # shorter one once ended before the request was held).
    async with streaming(target, "large", max_tokens=LONG) as stream:
        held = asyncio.create_task(chat(router, "small", request_id="held"))
        await eventually(lambda: waiters(stack, "small"), timeout=10)
        assert not stream.task.done(), "large finished before the request was held"
        result = await stream.task
        response = await held
        answered_at = time.time()
    assert result.finished, result
    assert response.status_code == 200, response.text
    assert response.headers["x-hotseat-backend"] == "small"
    assert answered_at >= result.ended_at
    [stopped] = [
        e for e in controller_log(stack, "process_member_stopped") if e["member"] == "large"
    ]
    assert at(stopped) >= result.ended_at - 0.5
    assert stopped["exit_code"] != -signal.SIGKILL
    assert controller_log(stack, "process_member_killed") == []


async def test_member_killed_out_of_band_is_detected_and_recovered(
    make_stack: Make, llama: Llama, tmp_path: Path
) -> None:
    """small's llama-server SIGKILLed behind the controller's back: resident_lost is audited
    and the next request is served by a fresh small process."""
    data = tmp_path / "members"
    config = llama_config(llama, data)
    stack = await started(make_stack, config)
    old = pid_of(data, "small")
    assert old is not None
    os.kill(old, signal.SIGKILL)
    await stack.wait_audit(
        lambda e: e["outcome"] == "resident_lost" and e["member"] == "small", timeout=20
    )
    response = await chat(stack.routers[0].url, "small")
    assert response.status_code == 200, response.text
    assert response.headers["x-hotseat-backend"] == "small"
    new = pid_of(data, "small")
    assert new is not None
    assert new != old
    assert alive(new)


async def test_unloading_a_member_serving_a_stream_escalates_without_hanging(
    make_stack: Make, llama: Llama, tmp_path: Path
) -> None:
    """An admin unload of large while requests that bypassed the router run on it (a
    stream, and a plain request that makes its SIGTERM hang certain): llama-server is
    SIGKILLed after stopGracePeriod, the controller answers its API while it waits out
    that grace, and it finishes the unload."""
    data = tmp_path / "members"
    config = llama_config(llama, data, grace="2s", pool={"default": "large"})
    stack = await started(make_stack, config)
    pid = pid_of(data, "large")
    assert pid is not None
    admin = {"authorization": f"Bearer {stack.admin_token}"}
    async with (
        streaming(member_url(config, "large"), "large", max_tokens=LONG) as stream,
        hanging(member_url(config, "large"), port_of(config, "large"), "large"),
        httpx.AsyncClient(timeout=5, trust_env=False) as client,
    ):
        began = time.monotonic()
        forced = await client.post(
            f"{stack.controller_url}/v1/pools/{POOL}/unload",
            json={"force": True},  # large's /slots is busy on purpose
            headers=admin,
        )
        assert forced.status_code == 200, forced.text
        answers: list[tuple[float, dict[str, Any]]] = []

        async def unloaded() -> bool:
            state = (await client.get(f"{stack.controller_url}/v1/pools/{POOL}")).json()
            answers.append((time.time(), state))
            return bool(
                state["phase"] == "idle" and state["resident"] is None and state["swapping"] is None
            )

        await eventually(unloaded, timeout=60, interval=0.05)
        elapsed = time.monotonic() - began
        result = await stream.task
    assert elapsed >= 2.0, "large stopped before its grace period: it did not hang"
    assert not result.finished, result
    assert not alive(pid)
    assert not port_open(port_of(config, "large"))
    [killed] = controller_log(stack, "process_member_killed")
    assert killed["member"] == "large"
    # The controller's API answered while it waited out the grace: an answer that still
    # shows the unload running came back before the kill.
    during = [t for t, state in answers if state["phase"] == "unloading" and t < at(killed)]
    assert during, answers


async def test_controller_shutdown_stops_a_streaming_member_within_its_grace(
    make_stack: Make, llama: Llama, tmp_path: Path
) -> None:
    """SIGTERM to the controller while its resident serves requests that bypassed the router
    (a stream, and a plain request that makes its SIGTERM hang certain): the controller
    SIGKILLs the member after its grace, exits by itself, and leaves no llama-server."""
    data = tmp_path / "members"
    config = llama_config(llama, data, grace="2s", pool={"default": "large"})
    stack = await started(make_stack, config)
    pid = pid_of(data, "large")
    assert pid is not None
    async with (
        streaming(member_url(config, "large"), "large", max_tokens=LONG) as stream,
        hanging(member_url(config, "large"), port_of(config, "large"), "large"),
    ):
        code = await asyncio.to_thread(stack.controllers["c1"].stop, 20)
        result = await stream.task
    # 0, or -SIGTERM: uvicorn re-raises the signal once its shutdown is complete; stop()
    # SIGKILLs a process still running after 20 s, which would read -SIGKILL here.
    assert code in {0, -signal.SIGTERM}, stack.controllers["c1"].log_text()[-3000:]
    assert not result.finished
    assert not alive(pid)
    assert not port_open(port_of(config, "large"))
    assert [e["member"] for e in controller_log(stack, "process_member_killed")] == ["large"]
