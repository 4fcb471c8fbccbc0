"""Pool controller benchmark: prints, in one run,

1. acquire+release round trip p50/p99 at 1, 8 and 64 concurrent callers (real NATS,
   Redis and controller process; the member is resident so every acquire is a grant);
2. pooled-request throughput through the router as a ratio of unpooled (same sim
   upstream behind a pooled and an unpooled backend; wrk drives both);
3. IfIdle skip decision latency (incumbent busy -> ``incumbent_busy`` round trip);
4. swap orchestration overhead: swap time minus the driver's own unload+load time.

Run: ``.venv/bin/python bench/pool_bench.py`` (needs ``wrk`` for part 2: ``apt-get install wrk``).
Everything runs on loopback with private servers; nothing is left running.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import nats
import psutil
import yaml

from hotseat.launcher import ProcessGroup, free_port, start_nats, start_redis, start_service
from hotseat_common.config.model import PoolActivation
from hotseat_common.messages import (
    ACQUIRE_REPLY,
    AcquireRequest,
    Granted,
    IncumbentBusyReply,
    ReleaseRequest,
)
from hotseat_common.subjects import Subjects

PREFIX = "bench"
LOAD_S, UNLOAD_S = 0.5, 0.1


def config(ports: dict[str, int]) -> dict[str, Any]:
    member = {
        "loadSeconds": LOAD_S,
        "unloadSeconds": UNLOAD_S,
        "memoryGiB": 10,
        "tokensPerSecond": 100000,
        "slots": 64,
    }
    return {
        "router": {"name": "bench"},
        "backends": [
            {
                "name": "a",
                "address": f"http://127.0.0.1:{ports['a']}",
                "pool": {"name": "gpu0", "member": "a"},
            },
            {
                "name": "b",
                "address": f"http://127.0.0.1:{ports['b']}",
                "pool": {"name": "gpu0", "member": "b"},
            },
            {"name": "direct", "address": f"http://127.0.0.1:{ports['a']}"},
        ],
        "pools": [
            {
                "name": "gpu0",
                "leaseTtl": "30s",
                "default": "a",
                "driver": {"kind": "sim", "gpuMemoryGiB": 16},
                "members": [{"name": "a", "sim": member}, {"name": "b", "sim": member}],
            }
        ],
        "rules": [
            {"name": "pooled", "match": {"models": ["pooled"]}, "route": {"backends": ["a"]}},
            {
                "name": "unpooled",
                "match": {"models": ["unpooled"]},
                "route": {"backends": ["direct"]},
            },
        ],
    }


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(value: float) -> str:
    return f"{value * 1000:.2f} ms"


def summary(samples: list[float]) -> str:
    return f"p50 {ms(pct(samples, 0.5))}  p99 {ms(pct(samples, 0.99))}  (n={len(samples)})"


async def acquire_release(nc: Any, subjects: Subjects, concurrency: int, total: int) -> list[float]:
    samples: list[float] = []

    async def worker(count: int) -> None:
        for _ in range(count):
            request = AcquireRequest(
                pool="gpu0",
                member="a",
                mode=PoolActivation.WAIT,
                request_id=uuid.uuid4().hex,
                router="bench",
                deadline=time.time() + 30,
            )
            t0 = time.perf_counter()
            reply = ACQUIRE_REPLY.validate_json(
                (await nc.request(subjects.acquire, request.to_bytes(), timeout=5)).data
            )
            assert isinstance(reply, Granted), reply
            release = ReleaseRequest(pool="gpu0", member="a", lease_id=reply.lease_id)
            await nc.request(subjects.release, release.to_bytes(), timeout=5)
            samples.append(time.perf_counter() - t0)

    await asyncio.gather(*(worker(total // concurrency) for _ in range(concurrency)))
    return samples


async def skip_latency(nc: Any, subjects: Subjects, n: int) -> list[float]:
    hold = AcquireRequest(
        pool="gpu0", member="a", request_id="holder", router="bench", deadline=time.time() + 60
    )
    held = ACQUIRE_REPLY.validate_json(
        (await nc.request(subjects.acquire, hold.to_bytes(), timeout=5)).data
    )
    assert isinstance(held, Granted)
    samples = []
    for _ in range(n):
        ask = AcquireRequest(
            pool="gpu0",
            member="b",
            mode=PoolActivation.IF_IDLE,
            request_id=uuid.uuid4().hex,
            router="bench",
            deadline=time.time() + 30,
        )
        t0 = time.perf_counter()
        reply = ACQUIRE_REPLY.validate_json(
            (await nc.request(subjects.acquire, ask.to_bytes(), timeout=5)).data
        )
        samples.append(time.perf_counter() - t0)
        assert isinstance(reply, IncumbentBusyReply), reply
    release = ReleaseRequest(pool="gpu0", member="a", lease_id=held.lease_id)
    await nc.request(subjects.release, release.to_bytes(), timeout=5)
    return samples


async def swap_overhead(nc: Any, subjects: Subjects, swaps: int) -> list[float]:
    """Time from the acquire that starts a swap to its grant, minus unload + load."""
    samples = []
    member = "a"
    for _ in range(swaps):
        member = "b" if member == "a" else "a"
        request_id = uuid.uuid4().hex
        events = await nc.subscribe(subjects.pool_events("gpu0"))
        t0 = time.perf_counter()
        while True:
            ask = AcquireRequest(
                pool="gpu0",
                member=member,
                request_id=request_id,
                router="bench",
                deadline=time.time() + 30,
            )
            reply = ACQUIRE_REPLY.validate_json(
                (await nc.request(subjects.acquire, ask.to_bytes(), timeout=5)).data
            )
            if isinstance(reply, Granted):
                break
            try:
                await events.next_msg(timeout=10)
            except nats.errors.TimeoutError:
                raise RuntimeError(f"no pool event for 10 s after {reply!r}") from None
        samples.append(time.perf_counter() - t0 - LOAD_S - UNLOAD_S)
        await events.unsubscribe()
        release = ReleaseRequest(pool="gpu0", member=member, lease_id=reply.lease_id)
        await nc.request(subjects.release, release.to_bytes(), timeout=5)
    return samples


def wrk(url: str, model: str, connections: int, seconds: int) -> float:
    lua = Path(tempfile.mkdtemp()) / "post.lua"
    body = json.dumps(
        {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    )
    lua.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = '{body}'\n"
    )
    out = subprocess.run(
        [
            "wrk",
            "-t",
            "1",
            "-c",
            str(connections),
            "-d",
            f"{seconds}s",
            "-s",
            str(lua),
            url + "/v1/chat/completions",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in out.splitlines():
        if line.startswith("Requests/sec:"):
            return float(line.split()[1])
    raise RuntimeError(out)


async def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="hotseat-bench-"))
    group = ProcessGroup()
    try:
        nats_proc = group.add(start_nats(work / "nats"))
        redis_proc = group.add(start_redis(work / "redis"))
        ports = {"a": free_port(), "b": free_port()}
        cfg = work / "hotseat.yaml"
        cfg.write_text(yaml.safe_dump(config(ports)))
        env = {
            "HOTSEAT_NATS_URL": nats_proc.url,
            "HOTSEAT_REDIS_URL": redis_proc.url,
            "HOTSEAT_SUBJECT_PREFIX": PREFIX,
            "HOTSEAT_KEY_PREFIX": PREFIX,
            "HOTSEAT_CONFIG": str(cfg),
            "HOTSEAT_LOG_LEVEL": "warning",
        }
        for name, port in ports.items():
            group.add(
                start_service(
                    f"sim-{name}",
                    "hotseat-sim",
                    ["--backend", name],
                    port=port,
                    log_dir=work,
                    env=env,
                    ready_path="/control/state",
                )
            )
        controller = group.add(
            start_service(
                "controller", "hotseat-controller", [], port=free_port(), log_dir=work, env=env
            )
        )
        router = group.add(
            start_service("router", "hotseat-router", [], port=free_port(), log_dir=work, env=env)
        )
        nc = await nats.connect(nats_proc.url)
        subjects = Subjects(PREFIX)
        async with httpx.AsyncClient() as http:
            while (await http.get(f"{router.url}/v1/models")).status_code != 200:
                await asyncio.sleep(0.1)
        # Wait for the default member to be warm.
        while True:
            ask = AcquireRequest(
                pool="gpu0",
                member="a",
                request_id="warm",
                router="bench",
                deadline=time.time() + 30,
            )
            reply = ACQUIRE_REPLY.validate_json(
                (await nc.request(subjects.acquire, ask.to_bytes(), timeout=5)).data
            )
            if isinstance(reply, Granted):
                await nc.request(
                    subjects.release,
                    ReleaseRequest(pool="gpu0", member="a", lease_id=reply.lease_id).to_bytes(),
                    timeout=5,
                )
                break
            await asyncio.sleep(0.1)

        only_swaps = "--swaps-only" in sys.argv
        print("== acquire+release round trip (grant to the resident, then release)")
        controller_cpu = psutil.Process(controller.pid)
        for concurrency in () if only_swaps else (1, 8, 64):
            await acquire_release(nc, subjects, concurrency, 64 * 4)  # warm-up
            cpu_before = sum(controller_cpu.cpu_times()[:2])
            wall = time.perf_counter()
            samples = await acquire_release(nc, subjects, concurrency, 64 * 30)
            wall = time.perf_counter() - wall
            cpu = (sum(controller_cpu.cpu_times()[:2]) - cpu_before) / len(samples)
            print(
                f"  {concurrency:>2} concurrent: {summary(samples)}  "
                f"{len(samples) / wall:.0f} pairs/s  controller CPU {ms(cpu)}/pair"
            )

        print("== IfIdle skip decision (incumbent busy -> incumbent_busy)")
        samples = await skip_latency(nc, subjects, 500)
        print(f"  {summary(samples)}")

        if shutil.which("wrk"):
            print("== router throughput, pooled vs unpooled (same sim upstream, wrk -c 8, 10 s)")
            unpooled = wrk(router.url, "unpooled", 8, 10)
            pooled = wrk(router.url, "pooled", 8, 10)
            ratio = pooled / unpooled
            print(f"  unpooled {unpooled:.0f} req/s  pooled {pooled:.0f} req/s  ratio {ratio:.2f}")
        else:
            print("== router throughput: skipped (wrk not installed: apt-get install wrk)")

        print(
            f"== swap orchestration overhead (swap time minus unload {UNLOAD_S}s + load {LOAD_S}s)"
        )
        samples = await swap_overhead(nc, subjects, 10)
        print(
            f"  median {ms(statistics.median(samples))}  max {ms(max(samples))}  (n={len(samples)})"
        )
        await nc.close()
    finally:
        group.stop_all()


if __name__ == "__main__":
    asyncio.run(main())
