"""Scale-out, counted: Redis commands and NATS messages per pooled request for several
routers, controllers and pools, and the wake-up latency of held requests.

Counts, not timings, so that machine noise does not move them: Redis commands from
``INFO commandstats`` of the controllers' Redis (the sims keep their ledger in a Redis of
their own; commands inside Lua scripts are counted one by one, as Redis counts them),
NATS messages from the server's monitoring endpoint (``/varz``: ``in_msgs``, what
clients published, and ``out_msgs``, what the server delivered; JetStream's audit
publishes and acks included).

The traffic is the same in every configuration: ``--requests`` pooled requests with
``--concurrency`` in flight, spread round-robin over the routers, all to one pool's
resident member. The other pools exist and are idle (no ``default`` member, so they
need no sim process); their background is the commands counted over as long with no
traffic, so the per-request figure is given both raw and net of it.

Wake-up: ``--held N`` requests for the pool's other member are sent at once; the swap
they cause commits (the pool's state-change notification names the new resident), and
the time from that notification to the first held request's response headers is one
sample; the pool then swaps back, ``--swaps`` times.

    .venv/bin/python bench/scale_out.py [--requests 2000] [--concurrency 8]
        [--matrix "1,1,1 2,1,1 4,1,1 1,2,1 1,1,10 1,1,100"]   # routers,controllers,pools
        [--held 1,10,100] [--swaps 10]

This is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import nats
import redis.asyncio as aioredis
import yaml

from hotseat.launcher import (
    Managed,
    ProcessGroup,
    free_port,
    start_nats,
    start_redis,
    start_service,
)
from hotseat_common.messages import PoolStateChanged
from hotseat_common.subjects import Subjects

PREFIX = "scale"
SIM = {"loadSeconds": 0.3, "unloadSeconds": 0.1, "memoryGiB": 10, "slots": 256,
       "tokensPerSecond": 100000}  # fmt: skip
BODY = {"max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}


def config(pools: int, ports: dict[str, int]) -> dict[str, Any]:
    backends: list[dict[str, Any]] = []
    pool_list: list[dict[str, Any]] = []
    for p in range(pools):
        for m in ("a", "b"):
            # Only pool 0 is served: the others' members have no process behind them.
            port = ports.get(f"p{p}{m}") or free_port()
            backends.append({
                "name": f"p{p}{m}", "address": f"http://127.0.0.1:{port}",
                "pool": {"name": f"gpu{p}", "member": m},
            })  # fmt: skip
        pool: dict[str, Any] = {
            "name": f"gpu{p}",
            "leaseTtl": "30s",
            "swapBudget": "120s",
            "driver": {"kind": "sim", "gpuMemoryGiB": 16},
            "members": [{"name": m, "sim": SIM} for m in ("a", "b")],
        }
        if p == 0:
            pool["default"] = "a"
        pool_list.append(pool)
    return {
        "backends": backends,
        "pools": pool_list,
        "rules": [
            {"name": m, "match": {"models": [m]}, "route": {"backends": [f"p0{m}"]}}
            for m in ("a", "b")
        ],
    }


@dataclass
class Fleet:
    group: ProcessGroup
    nats: Managed
    monitor: str
    redis: Managed
    controllers: list[Managed]
    routers: list[Managed]


async def start_fleet(work: Path, routers: int, controllers: int, pools: int) -> Fleet:
    group = ProcessGroup()
    monitor_port = free_port()
    nats_proc = group.add(start_nats(work / "nats", extra_args=("-m", str(monitor_port))))
    counted = group.add(start_redis(work / "redis"))
    sims_redis = group.add(start_redis(work / "redis-sims"))
    ports = {"p0a": free_port(), "p0b": free_port()}
    cfg = work / "hotseat.yaml"
    cfg.write_text(yaml.safe_dump(config(pools, ports)))
    env = {
        "HOTSEAT_NATS_URL": nats_proc.url,
        "HOTSEAT_SUBJECT_PREFIX": PREFIX,
        "HOTSEAT_KEY_PREFIX": PREFIX,
        "HOTSEAT_CONFIG": str(cfg),
        "HOTSEAT_LOG_LEVEL": "warning",
    }
    for name, port in ports.items():
        group.add(
            start_service(
                f"sim-{name}", "hotseat-sim", ["--backend", name], port=port, log_dir=work,
                env={**env, "HOTSEAT_REDIS_URL": sims_redis.url}, ready_path="/control/state",
                timeout=120,
            )
        )  # fmt: skip
    ctl = [
        group.add(
            start_service(
                f"controller-{i}",
                "hotseat-controller",
                ["--instance", f"c{i}"],
                port=free_port(),
                log_dir=work,
                env={**env, "HOTSEAT_REDIS_URL": counted.url},
                timeout=120,
            )
        )
        for i in range(controllers)
    ]
    rtr = [
        group.add(
            start_service(
                f"router-{i}",
                "hotseat-router",
                ["--instance", f"r{i}"],
                port=free_port(),
                log_dir=work,
                env=env,
                timeout=120,
            )
        )
        for i in range(routers)
    ]
    return Fleet(group, nats_proc, f"http://127.0.0.1:{monitor_port}", counted, ctl, rtr)


async def redis_calls(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


async def nats_msgs(http: httpx.AsyncClient, monitor: str) -> tuple[int, int]:
    varz = (await http.get(monitor + "/varz")).json()
    return int(varz["in_msgs"]), int(varz["out_msgs"])


async def drive(
    http: httpx.AsyncClient, urls: list[str], model: str, total: int, concurrency: int
) -> float:
    """``total`` requests, ``concurrency`` at a time, round-robin over ``urls``."""
    targets = itertools.cycle(urls)
    remaining = total
    started = time.monotonic()

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            url = next(targets)
            response = await http.post(
                url + "/v1/chat/completions", json={**BODY, "model": model}, timeout=120
            )
            if response.status_code != 200:
                raise SystemExit(f"{url}: {response.status_code} {response.text[:300]}")

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.monotonic() - started


async def counts(args: argparse.Namespace, routers: int, controllers: int, pools: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="hotseat-scale-"))
    fleet = await start_fleet(work, routers, controllers, pools)
    try:
        client = aioredis.from_url(fleet.redis.url)
        urls = [r.url for r in fleet.routers]
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=200)) as http:
            await drive(http, urls, "a", 50 * routers, min(args.concurrency, 4))  # warm-up
            await asyncio.sleep(2)
            r0, (i0, o0) = await redis_calls(client), await nats_msgs(http, fleet.monitor)
            seconds = await drive(http, urls, "a", args.requests, args.concurrency)
            r1, (i1, o1) = await redis_calls(client), await nats_msgs(http, fleet.monitor)
            # The background over as long, with no traffic (leases released, pools quiet).
            await asyncio.sleep(3)
            r2, (i2, o2) = await redis_calls(client), await nats_msgs(http, fleet.monitor)
            await asyncio.sleep(seconds)
            r3, (i3, o3) = await redis_calls(client), await nats_msgs(http, fleet.monitor)
        await client.aclose()
        n = args.requests
        redis_bg, in_bg, out_bg = r3 - r2 - 1, i3 - i2, o3 - o2
        print(
            f"  {routers} router(s), {controllers} controller(s), {pools:>3} pool(s):"
            f" Redis {(r1 - r0 - 1) / n:6.2f}/req (net of idle {(r1 - r0 - 1 - redis_bg) / n:6.2f})"
            f"  NATS in {(i1 - i0) / n:5.2f}/req (net {(i1 - i0 - in_bg) / n:5.2f})"
            f"  out {(o1 - o0) / n:5.2f}/req (net {(o1 - o0 - out_bg) / n:5.2f})"
            f"  [{n / seconds:.0f} req/s; idle over {seconds:.1f} s: Redis {redis_bg},"
            f" NATS in {in_bg}]",
            flush=True,
        )
    finally:
        fleet.group.stop_all()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def wake_up(args: argparse.Namespace, held: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="hotseat-wake-"))
    fleet = await start_fleet(work, 1, 1, 1)
    nc = await nats.connect(fleet.nats.url)
    try:
        url = fleet.routers[0].url
        commits: dict[str, asyncio.Future[float]] = {}

        async def on_change(msg: Any) -> None:
            changed = PoolStateChanged.from_bytes(msg.data)
            future = commits.get(changed.resident or "")
            if changed.phase == "idle" and future is not None and not future.done():
                future.set_result(time.monotonic())

        await nc.subscribe(Subjects(PREFIX).pool_events("gpu0"), cb=on_change)
        samples: list[float] = []
        limits = httpx.Limits(max_connections=held + 10, max_keepalive_connections=held + 10)
        async with httpx.AsyncClient(limits=limits, timeout=120) as http:
            await drive(http, [url], "a", 5, 1)
            member = "a"
            for _ in range(args.swaps):
                member = "b" if member == "a" else "a"
                loop = asyncio.get_running_loop()
                commits[member] = loop.create_future()
                first: asyncio.Future[float] = loop.create_future()

                async def one(target: str, first: asyncio.Future[float] = first) -> None:
                    async with http.stream(
                        "POST", url + "/v1/chat/completions", json={**BODY, "model": target}
                    ) as response:
                        if not first.done():
                            first.set_result(time.monotonic())
                        await response.aread()
                        if response.status_code != 200:
                            raise SystemExit(f"{response.status_code} {response.text[:300]}")

                await asyncio.gather(*(one(member) for _ in range(held)))
                samples.append(first.result() - await commits[member])
        print(
            f"  {held:>3} held: commit -> first held response p50 {pct(samples, 0.5) * 1e3:6.2f} ms"
            f"  p99 {pct(samples, 0.99) * 1e3:6.2f} ms  max {max(samples) * 1e3:6.2f} ms"
            f"  ({len(samples)} swaps)",
            flush=True,
        )
    finally:
        await nc.close()
        fleet.group.stop_all()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--matrix", default="1,1,1 2,1,1 4,1,1 1,2,1 1,1,10 1,1,100")
    parser.add_argument("--held", default="1,10,100")
    parser.add_argument("--swaps", type=int, default=10)
    args = parser.parse_args()
    if args.matrix:
        print(f"== per pooled request ({args.requests} requests, {args.concurrency} in flight)")
        for cell in args.matrix.split():
            routers, controllers, pools = (int(x) for x in cell.split(","))
            await counts(args, routers, controllers, pools)
    if args.held:
        print("== wake-up of held requests (swap commit -> first held response headers)")
        for held in (int(x) for x in args.held.split(",")):
            await wake_up(args, held)


if __name__ == "__main__":
    asyncio.run(main())
