"""Pool controller benchmark: prints, in one run,

1. acquire+release round trip p50/p99 at 1, 8 and 64 concurrent callers (real NATS,
   Redis and controller process; the member is resident so every acquire is a grant),
   with the CPU each process spends per pair; then the same through the router's own
   activation client, which shares a live lease between concurrent requests;
2. IfIdle skip decision latency (incumbent busy -> ``incumbent_busy`` round trip);
3. swap orchestration overhead: swap time minus the driver's own unload+load time;
4. pooled-request throughput through the router as a ratio of unpooled (same sim
   upstream behind a pooled and an unpooled backend; wrk drives both, with 1 connection,
   where every request acquires and releases, and with 8, where requests share leases),
   how many acquires reached the controller per pooled request, and the CPU per request
   of the router, unpooled and pooled, and of the controller.

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
from hotseat_common.connections import open_nats
from hotseat_common.messages import (
    ACQUIRE_REPLY,
    AcquireRequest,
    Granted,
    IncumbentBusyReply,
    ReleaseRequest,
)
from hotseat_common.subjects import Subjects
from hotseat_router.activation.nats import NatsActivationClient

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


def acquire_request(
    member: str, mode: PoolActivation = PoolActivation.WAIT, request_id: str | None = None
) -> AcquireRequest:
    attempt = request_id or uuid.uuid4().hex
    return AcquireRequest(
        pool="gpu0",
        member=member,
        mode=mode,
        attempt=attempt,
        request_id=attempt,
        router="bench",
        hold_s=30,
    )


async def ask(nc: Any, subjects: Subjects, request: AcquireRequest) -> Any:
    response = await nc.request(subjects.acquire, request.to_bytes(), timeout=5)
    return ACQUIRE_REPLY.validate_json(response.data)


async def release(nc: Any, subjects: Subjects, member: str, lease_id: str) -> None:
    message = ReleaseRequest(pool="gpu0", member=member, lease_id=lease_id)
    await nc.request(subjects.release, message.to_bytes(), timeout=5)


async def acquire_release(nc: Any, subjects: Subjects, concurrency: int, total: int) -> list[float]:
    samples: list[float] = []

    async def worker(count: int) -> None:
        for _ in range(count):
            request = acquire_request("a")
            t0 = time.perf_counter()
            reply = await ask(nc, subjects, request)
            assert isinstance(reply, Granted), reply
            await release(nc, subjects, "a", reply.lease_id)
            samples.append(time.perf_counter() - t0)

    await asyncio.gather(*(worker(total // concurrency) for _ in range(concurrency)))
    return samples


async def router_client_pairs(
    client: NatsActivationClient, concurrency: int, total: int
) -> list[float]:
    """Acquire+release as a router request pays it (concurrent requests share a lease)."""
    samples: list[float] = []

    async def worker(count: int) -> None:
        for _ in range(count):
            t0 = time.perf_counter()
            lease = await client.acquire(
                pool="gpu0",
                member="a",
                mode=PoolActivation.WAIT,
                attempt=uuid.uuid4().hex,
                request_id="bench",
                budget_s=30,
            )
            await client.release(lease)
            samples.append(time.perf_counter() - t0)
            await asyncio.sleep(0)  # let the other requests in, as a real request would

    await asyncio.gather(*(worker(total // concurrency) for _ in range(concurrency)))
    return samples


async def skip_latency(nc: Any, subjects: Subjects, n: int) -> list[float]:
    held = await ask(nc, subjects, acquire_request("a", request_id="holder"))
    assert isinstance(held, Granted)
    samples = []
    for _ in range(n):
        request = acquire_request("b", PoolActivation.IF_IDLE)
        t0 = time.perf_counter()
        reply = await ask(nc, subjects, request)
        samples.append(time.perf_counter() - t0)
        assert isinstance(reply, IncumbentBusyReply), reply
    await release(nc, subjects, "a", held.lease_id)
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
            reply = await ask(nc, subjects, acquire_request(member, request_id=request_id))
            if isinstance(reply, Granted):
                break
            try:
                await events.next_msg(timeout=10)
            except nats.errors.TimeoutError:
                raise RuntimeError(f"no pool event for 10 s after {reply!r}") from None
        samples.append(time.perf_counter() - t0 - LOAD_S - UNLOAD_S)
        await events.unsubscribe()
        await release(nc, subjects, member, reply.lease_id)
    return samples


class CpuMeter:
    """CPU seconds each named process spent between ``start`` and ``per``."""

    def __init__(self, pids: dict[str, int]) -> None:
        self._procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self._before: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        return {name: sum(p.cpu_times()[:2]) for name, p in self._procs.items()}

    def start(self) -> None:
        self._before = self._now()

    def spent(self, count: float) -> dict[str, float]:
        """CPU µs per ``count`` each process spent since ``start``."""
        after = self._now()
        return {name: (after[name] - self._before[name]) / count * 1e6 for name in self._procs}

    def per(self, count: float) -> str:
        return ", ".join(f"{name} {us / 1000:.2f}" for name, us in self.spent(count).items())


async def controller_acquires(http: httpx.AsyncClient, url: str) -> float:
    text = (await http.get(f"{url}/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("hotseat_pool_acquires_total{")
    )


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
        nc = await open_nats(nats_proc.url)
        subjects = Subjects(PREFIX)
        async with httpx.AsyncClient() as http:
            while (await http.get(f"{router.url}/v1/models")).status_code != 200:
                await asyncio.sleep(0.1)
        # Wait for the default member to be warm.
        # One request id, asked again as a router would: its grant takes it off the waiters.
        warm = acquire_request("a", request_id="warm-up")
        while not isinstance(reply := await ask(nc, subjects, warm), Granted):
            await asyncio.sleep(0.1)
        await release(nc, subjects, "a", reply.lease_id)

        only_swaps = "--swaps-only" in sys.argv
        cpu = CpuMeter(
            {
                "controller": controller.pid,
                "caller": psutil.Process().pid,
                "nats": nats_proc.pid,
                "redis": redis_proc.pid,
            }
        )
        print("== acquire+release round trip (grant to the resident, then release)")
        for concurrency in () if only_swaps else (1, 8, 64):
            await acquire_release(nc, subjects, concurrency, 64 * 4)  # warm-up
            cpu.start()
            wall = time.perf_counter()
            samples = await acquire_release(nc, subjects, concurrency, 64 * 30)
            wall = time.perf_counter() - wall
            print(
                f"  {concurrency:>2} concurrent: {summary(samples)}  "
                f"{len(samples) / wall:.0f} pairs/s"
            )
            print(f"      CPU ms per pair: {cpu.per(len(samples))}")

        print("== the same through the router's activation client (leases shared)")
        async with NatsActivationClient(nc, subjects, "bench") as client:
            for concurrency in () if only_swaps else (1, 8, 64):
                await router_client_pairs(client, concurrency, 64 * 4)
                samples = await router_client_pairs(client, concurrency, 64 * 30)
                print(f"  {concurrency:>2} concurrent: {summary(samples)}")

        print("== IfIdle skip decision (incumbent busy -> incumbent_busy)")
        samples = await skip_latency(nc, subjects, 500)
        print(f"  {summary(samples)}")

        # Before the router runs: a sim that just served thousands of requests still
        # writes their ledger entries for a while, which slows its own unload.
        print(
            f"== swap orchestration overhead (swap time minus unload {UNLOAD_S}s + load {LOAD_S}s)"
        )
        samples = await swap_overhead(nc, subjects, 10)
        print(
            f"  median {ms(statistics.median(samples))}  max {ms(max(samples))}  (n={len(samples)})"
        )
        # Leave a resident again for the router's pooled backend.
        while not isinstance(reply := await ask(nc, subjects, warm), Granted):
            await asyncio.sleep(0.05)
        await release(nc, subjects, "a", reply.lease_id)

        if shutil.which("wrk") and not only_swaps:
            print("== router throughput, pooled vs unpooled (same sim upstream, wrk, 10 s each)")
            router_cpu = CpuMeter({"router": router.pid, "controller": controller.pid})
            async with httpx.AsyncClient() as http:
                for connections in (1, 8):
                    router_cpu.start()
                    unpooled = wrk(router.url, "unpooled", connections, 10)
                    plain = router_cpu.spent(unpooled * 10)["router"]
                    before = await controller_acquires(http, controller.url)
                    router_cpu.start()
                    pooled = wrk(router.url, "pooled", connections, 10)
                    requests = pooled * 10
                    spent = router_cpu.spent(requests)
                    acquires = await controller_acquires(http, controller.url) - before
                    print(
                        f"  -c {connections}: unpooled {unpooled:.0f} req/s  pooled {pooled:.0f}"
                        f" req/s  ratio {pooled / unpooled:.2f}  controller acquires per pooled"
                        f" request {acquires / requests:.2f}\n"
                        f"         CPU µs per request: router unpooled {plain:.0f}, pooled"
                        f" {spent['router']:.0f} ({spent['router'] - plain:+.0f} for the pool);"
                        f" controller per pooled request {spent['controller']:.0f}"
                    )
        elif not only_swaps:
            print("== router throughput: skipped (wrk not installed: apt-get install wrk)")

        await nc.close()
    finally:
        group.stop_all()


if __name__ == "__main__":
    asyncio.run(main())
