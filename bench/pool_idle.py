"""Idle cost per pool: Redis commands per second a controller spends on pools where
nothing happens, counted from ``INFO commandstats`` (a count, not a timing: machine
noise does not move it).

A fleet of two-member sim pools (each with a ``default`` member, which the controller
warms and then leaves resident) runs under one controller; the sims keep their ledger
in a Redis of their own, so the Redis counted is the controller's alone (commands run
inside its Lua scripts included: that is how Redis counts them). Once every pool is
warm, the count runs for ``--seconds``.

    .venv/bin/python bench/pool_idle.py [--pools 8] [--seconds 30] [--controller-args ...]

This is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis
from fleet import Fleet, sim_backend, start_infra

from hotseat.launcher import free_port

PREFIX = "idle"


def fleet_config(pools: int, ports: dict[str, int]) -> dict[str, Any]:
    member = {"loadSeconds": 0.2, "unloadSeconds": 0.1, "memoryGiB": 10, "slots": 4}
    backends, pool_list = [], []
    for p in range(pools):
        members = []
        for m in ("a", "b"):
            name = f"p{p}{m}"
            backends.append(sim_backend(name, ports[name], f"gpu{p}", m))
            members.append({"name": m, "sim": member})
        pool_list.append({
            "name": f"gpu{p}",
            "default": "a",
            "driver": {"kind": "sim", "gpuMemoryGiB": 16},
            "members": members,
        })  # fmt: skip
    return {
        "backends": backends,
        "pools": pool_list,
        "rules": [{"name": "all", "route": {"backends": [backends[0]["name"]]}}],
    }


async def total_calls(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


async def run(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="hotseat-idle-"))
    infra = start_infra(work, sims_redis=True)
    ports = {f"p{p}{m}": free_port() for p in range(args.pools) for m in ("a", "b")}
    fleet = Fleet(work, infra, fleet_config(args.pools, ports), prefix=PREFIX)
    try:
        fleet.start_sims()
        controller = fleet.start_controller(args=args.controller_args)
        async with httpx.AsyncClient() as http:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                pools = (await http.get(controller.url + "/v1/pools")).json()["pools"]
                if all(p.get("resident") == "a" and p.get("phase") == "idle" for p in pools):
                    break
                await asyncio.sleep(0.5)
            else:
                raise SystemExit("the pools did not all warm their default member")
        client = aioredis.from_url(infra.redis.url)
        await asyncio.sleep(args.settle)
        before, started = await total_calls(client), time.monotonic()
        await asyncio.sleep(args.seconds)
        calls = await total_calls(client) - before - 1  # the INFO of the first read
        seconds = time.monotonic() - started
        await client.aclose()
        rate = calls / seconds
        print(
            f"{args.pools} idle pools, {seconds:.0f} s: {calls} Redis commands, {rate:.1f}/s,"
            f" {rate / args.pools:.2f}/s per pool (controller alone)"
        )
    finally:
        fleet.stop()
        infra.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--settle", type=float, default=5, help="seconds after warm-up")
    parser.add_argument(
        "--controller-args", nargs="*", default=[], help="extra flags for hotseat-controller"
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
