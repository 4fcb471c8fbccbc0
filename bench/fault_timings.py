"""Fault timings: how long the fault tests' guarantees take, measured, not asserted.

The tests in tests/fault and tests/controller check the order of events (a lease gone
before its expiry, a 503 that is the no-responders answer, queue-full answers before every
held one); how fast each happens depends on the machine and its load, so the figures live
here. Each round starts real processes (sims, a controller, routers) on private NATS and
Redis, provokes one fault and prints the time it took, over ``--rounds`` rounds:

1. a router SIGKILLed mid-stream: until its lease is reaped (guarantee 1; leaseTtl 2 s,
   reaper tick 0.1 s);
2. a client that leaves mid-stream: until its lease is released (guarantee 15);
3. no controller: a pooled request's 503 (guarantee 8);
4. the store blackholed: until a command waiting on it is answered StoreDown, and a later
   one is refused (guarantee 5; probe every 0.1 s, 0.3 s timeout);
5. a burst of 40 requests over a 10-request queue while a swap outlives its 1.5 s
   budget: the held and the queue-full answers, and the router's memory over four bursts
   (guarantee 14);
6. NATS SIGKILLed and restarted: until each of two routers serves again (guarantee 7).

    .venv/bin/python bench/fault_timings.py [--rounds 3]

Nothing is left running. This is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from hotseat.launcher import free_port, start_nats, start_redis
from hotseat_common.settings import RedisSettings
from hotseat_pool_controller.store.health import StoreDown, StoreHealth
from hotseat_pool_controller.store.link import RedisLink

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the test tree's stack, clients and fault proxy

from tests.support.clients import chat, chat_body, live_stream  # noqa: E402
from tests.support.faultproxy import FaultProxy  # noqa: E402
from tests.support.faultstack import FaultStack  # noqa: E402
from tests.support.infra import unique_prefix  # noqa: E402
from tests.support.procs import rss_bytes  # noqa: E402
from tests.support.stack import pool_stack_config  # noqa: E402
from tests.support.waiting import eventually  # noqa: E402

Figures = defaultdict[str, list[float]]


@asynccontextmanager
async def stack(
    infra: tuple[str, str], workdir: Path, config: dict[str, Any], *, routers: int = 1
) -> AsyncIterator[FaultStack]:
    nats_url, redis_url = infra
    run = workdir / unique_prefix()
    run.mkdir()
    fleet = FaultStack(run, unique_prefix(), nats_url, redis_url, config)
    try:
        await asyncio.to_thread(fleet.start_sims)
        await asyncio.to_thread(fleet.start_controller, "c1")
        for _ in range(routers):
            await asyncio.to_thread(fleet.start_router)
        await fleet.wait_resident("judge", timeout=30)
        yield fleet
    finally:
        await asyncio.to_thread(fleet.stop)


async def killed_router(infra: tuple[str, str], workdir: Path, figures: Figures) -> None:
    async with stack(infra, workdir, pool_stack_config(pool={"leaseTtl": "2s"})) as fleet:
        doomed = await asyncio.to_thread(fleet.start_router)
        async with live_stream(doomed.url, "judge", max_tokens=400):
            doomed.kill()
            killed = time.monotonic()
            await eventually(lambda: _no_lease(fleet), timeout=30, interval=0.01)
            figures["1. killed router: lease reaped after (s)"].append(time.monotonic() - killed)


async def client_leaves(infra: tuple[str, str], workdir: Path, figures: Figures) -> None:
    async with stack(infra, workdir, pool_stack_config(pool={"leaseTtl": "30s"})) as fleet:
        async with live_stream(fleet.routers[0].url, "judge", max_tokens=400):
            pass
        left = time.monotonic()
        await eventually(lambda: _no_lease(fleet), timeout=30, interval=0.01)
        figures["2. client left mid-stream: lease released after (s)"].append(
            time.monotonic() - left
        )


async def no_controller(infra: tuple[str, str], workdir: Path, figures: Figures) -> None:
    nats_url, redis_url = infra
    run = workdir / unique_prefix()
    run.mkdir()
    fleet = FaultStack(run, unique_prefix(), nats_url, redis_url, pool_stack_config())
    try:
        await asyncio.to_thread(fleet.start_sims)
        router = await asyncio.to_thread(fleet.start_router)
        for _ in range(3):
            started = time.monotonic()
            response = await chat(router.url, "judge")
            assert response.status_code == 503, response.text
            figures["3. no controller: pooled 503 after (s)"].append(time.monotonic() - started)
    finally:
        await asyncio.to_thread(fleet.stop)


async def store_down(infra: tuple[str, str], _workdir: Path, figures: Figures) -> None:
    _, redis_url = infra
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with FaultProxy(port) as proxy:
        link = RedisLink(RedisSettings(redis_url=proxy.url("redis", "/0")), timeout=60)
        health = StoreHealth(link, interval=0.1, timeout=0.3)
        probe = asyncio.create_task(health.run())
        try:
            await health.guard(link.execute("PING"))
            proxy.blackhole()
            for figure in ("waiting command answered", "later command refused"):
                started = time.monotonic()
                try:
                    await health.guard(link.execute("GET", "k"))
                except StoreDown:
                    figures[f"4. store blackholed: {figure} after (s)"].append(
                        time.monotonic() - started
                    )
        finally:
            probe.cancel()
            await link.aclose()


async def burst(infra: tuple[str, str], workdir: Path, figures: Figures) -> None:
    budget, cap, size = 1.5, 10, 40
    config = pool_stack_config(
        pool={"leaseTtl": "3s", "swapBudget": f"{budget}s", "maxWaiters": cap},
        judge={"loadSeconds": 6.0},
        coder={"loadSeconds": 6.0},
    )
    async with stack(infra, workdir, config) as fleet:
        router = fleet.routers[0]
        limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
        rss = [rss_bytes(router)]
        target = "coder"
        async with httpx.AsyncClient(timeout=30, limits=limits) as http:
            for _ in range(4):
                answers = await asyncio.gather(
                    *(_timed(http, router.url, target) for _ in range(size))
                )
                rss.append(rss_bytes(router))
                for code, took in answers:
                    figures[f"5. burst: {code} answered after (s)"].append(took)
                await fleet.wait_resident(target, timeout=30)
                target = "judge" if target == "coder" else "coder"
        figures["5. burst: router RSS growth over 4 bursts (MiB)"].append(
            (rss[-1] - rss[1]) / 2**20
        )


async def nats_restart(infra: tuple[str, str], workdir: Path, figures: Figures) -> None:
    _, redis_url = infra
    port = free_port()
    data = workdir / unique_prefix()
    nats = start_nats(data, port=port)
    try:
        async with stack((nats.url, redis_url), workdir, pool_stack_config(), routers=2) as fleet:
            nats.kill()
            nats = await asyncio.to_thread(start_nats, data, port=port)
            restarted = time.monotonic()
            for router in fleet.routers:
                await eventually(lambda r=router: _serves(r.url), timeout=60, interval=0.05)
                figures["6. NATS restarted: router serves again after (s)"].append(
                    time.monotonic() - restarted
                )
    finally:
        nats.stop()


async def _no_lease(fleet: FaultStack) -> bool:
    return not await fleet.lease_expiries("judge")


async def _serves(url: str) -> bool:
    try:
        return (await chat(url, "judge", timeout=5)).status_code == 200
    except httpx.HTTPError:
        return False


async def _timed(http: httpx.AsyncClient, url: str, model: str) -> tuple[str, float]:
    started = time.monotonic()
    response = await http.post(f"{url}/v1/chat/completions", json=chat_body(model))
    return response.json()["error"]["code"], time.monotonic() - started


Measure = Callable[[tuple[str, str], Path, Figures], Awaitable[None]]
MEASURES: list[Measure] = [
    killed_router,
    client_leaves,
    no_controller,
    store_down,
    burst,
    nats_restart,
]


async def run(args: argparse.Namespace) -> None:
    figures: Figures = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="hotseat-fault-timings-") as tmp:
        workdir = Path(tmp)
        nats = start_nats(workdir / "nats")
        redis = start_redis(workdir / "redis")
        try:
            for measure in MEASURES:
                for _ in range(args.rounds):
                    await measure((nats.url, redis.url), workdir, figures)
        finally:
            nats.stop()
            redis.stop()
    print(f"{'figure':<60} {'n':>3} {'min':>7} {'median':>7} {'max':>7}")
    for name in sorted(figures):
        values = figures[name]
        print(
            f"{name:<60} {len(values):>3} {min(values):>7.3f} "
            f"{statistics.median(values):>7.3f} {max(values):>7.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each measurement")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
