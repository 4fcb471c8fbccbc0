"""``GET /v1/pool-updates`` and ``hotseat status --watch`` / ``--json`` on a real
controller: the stream follows a swap step by step, the terminal prints each change, and
an open stream never holds up the controller's shutdown."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hotseat.launcher import Managed, free_port, start_service
from hotseat.status_cli import server_sent_events
from tests.support.stack import Stack, pool_stack_config


@pytest.fixture
def stack(
    tmp_path: Path, prefix: str, nats_server: Managed, redis_server: Managed
) -> Iterator[Stack]:
    stack = Stack(
        tmp_path,
        prefix,
        nats_server.url,
        redis_server.url,
        pool_stack_config(coder={"loadSeconds": 1.0}),
    )
    try:
        stack.start_sims()
        stack.start_controller()
        yield stack
    finally:
        stack.stop()


async def _force_swap(stack: Stack, member: str) -> None:
    async with httpx.AsyncClient(base_url=stack.controller_url, timeout=10) as client:
        response = await client.post(
            "/v1/pools/gpu0/swap",
            json={"member": member},
            headers={"authorization": f"Bearer {stack.admin_token}"},
        )
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "started"


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _hotseat(*args: str) -> list[str]:
    return [sys.executable, "-m", "hotseat.cli", *args]


async def test_status_watch_json_prints_every_step_of_a_swap(stack: Stack) -> None:
    """``hotseat status --watch --json`` prints one line per change: judge resident, then
    the swap unloading or loading with nothing resident, then coder resident; plain
    ``--json`` prints what ``GET /v1/pools`` answers."""
    await stack.wait_resident("judge")
    once = subprocess.run(
        _hotseat("status", "--url", stack.controller_url, "--json"),
        capture_output=True,
        check=True,
        text=True,
    )
    assert json.loads(once.stdout)["pools"][0]["resident"] == "judge"

    watch = await asyncio.create_subprocess_exec(
        *_hotseat("status", "--url", stack.controller_url, "--watch", "--json"),
        stdout=asyncio.subprocess.PIPE,
        # Ctrl-C as a terminal sends it: a test run started in the background inherits
        # SIGINT ignored, and Python then installs no KeyboardInterrupt handler, so the
        # watch would never see the SIGINT below (the test hung to its timeout so).
        preexec_fn=_sigint_default,
    )
    assert watch.stdout is not None
    seen: list[dict[str, Any]] = []

    async def until(check: Any) -> dict[str, Any]:
        while True:
            try:
                # Bounds only a hang, so that its report says what the watch printed.
                line = await asyncio.wait_for(watch.stdout.readline(), 60)  # type: ignore[union-attr]
            except TimeoutError:
                raise AssertionError(f"the watch printed nothing for 60 s after {seen}") from None
            assert line, f"the watch ended; it printed {seen}"
            pool: dict[str, Any] = json.loads(line)["pools"][0]
            seen.append(pool)
            if check(pool):
                return pool

    try:
        await until(lambda p: p["resident"] == "judge" and p["phase"] == "idle")
        # coder's load lasts until the watch has printed it (a 1 s load could otherwise
        # end before the stream delivers a loading view, and the watch, which prints only
        # changes, would never print a swap in flight)
        await stack.hold_sim("coder", "loading")
        await _force_swap(stack, "coder")
        swapping = await until(lambda p: p["phase"] in {"unloading", "loading"})
        assert swapping["resident"] is None
        assert swapping["swapping"] == "coder"
        await until(lambda p: p["phase"] == "loading")
        await stack.hold_sim("coder")
        await until(lambda p: p["resident"] == "coder" and p["phase"] == "idle")
    finally:
        watch.send_signal(signal.SIGINT)
        assert await watch.wait() == 0, "Ctrl-C ends the watch cleanly"
    assert all(a != b for a, b in itertools.pairwise(seen)), "only changes are printed"


def test_server_sent_events_are_parsed_as_the_stream_sends_them() -> None:
    lines = ["retry: 2000", "", ": keep-alive", "", "event: pools", 'data: {"a": 1}', "",
             "data: one", "data: two", ""]  # fmt: skip
    assert list(server_sent_events(iter(lines))) == [
        ("pools", '{"a": 1}'),
        ("message", "one\ntwo"),
    ]


async def test_an_open_stream_does_not_hold_the_controllers_shutdown(
    tmp_path: Path, stack: Stack
) -> None:
    """A controller whose grace is longer than the test's timeout, with a stream open:
    on SIGTERM the stream ends and the process exits (without the shutdown hook it would
    wait the whole grace for the stream)."""
    controller = start_service(
        "controller-long-grace",
        "hotseat-controller",
        ["--instance", "long-grace"],
        port=free_port(),
        log_dir=tmp_path,
        env={**stack.env, "HOTSEAT_SHUTDOWN_GRACE": "3600"},
    )
    try:
        async with (
            httpx.AsyncClient(
                base_url=controller.url, timeout=httpx.Timeout(10, read=None)
            ) as client,
            client.stream("GET", "/v1/pool-updates") as response,
        ):
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = response.aiter_lines()
            async for line in lines:
                if line.startswith("event: pools"):
                    break
            controller.popen.send_signal(signal.SIGTERM)
            async for _ in lines:
                pass  # until the controller ends the stream
        # uvicorn exits by the signal it was stopped with, once its shutdown is done
        assert await asyncio.to_thread(controller.popen.wait) in {0, -signal.SIGTERM}
        assert "controller_stopped" in controller.log_text()
    finally:
        controller.kill()
