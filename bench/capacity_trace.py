"""Capacity pools against one-resident pools on the same trace (docs/adr/0008): one mixed
trace replayed through a real router, controller and sims, once with the four members in a
capacity pool of 24 GiB and once with the same members in a one-resident pool, printing
swaps (loads started by demand) per 100 requests, hold times (p50/p99/max, from
``x-hotseat-hold-ms``) and GPU-memory utilisation (the declared memory of the resident
members over the pool's, sampled from the pool view every 0.2 s).

The trace (seeded, the same for both pools): bursts of 4 to 10 requests about 0.1 s
apart, 0.5 to 1.5 s between bursts, each burst for one member picked with Zipf-like
weights (assistant 1, embedder 1/2, reranker 1/3, coder 1/4; ``--mix interleaved``: each
request picks its own member, the hardest case for either pool), 5 tokens a request. Members
(sim): assistant 6 GiB (1 s load), embedder and reranker 2 GiB (0.5 s), coder 20 GiB
(2 s; ``--coder-gib``): the three small ones fit together, the coder only beside the
embedder and the reranker (the GPU-sharing guide's example card).
Target (issue 14): at least 3x fewer swaps and a lower p99 hold in the capacity pool.
It also prints what the trace allows: the fewest loads any controller could do in the
capacity pool, knowing the whole trace in advance (``fewest_loads``).

    .venv/bin/python bench/capacity_trace.py [--requests 300] [--seed 7]

A measurement, not a test: counts (swaps, requests) are what noise cannot move; read the
times with the machine's load beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import signal
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import fleet as shared  # noqa: E402

from hotseat.launcher import free_port  # noqa: E402

FAST = shared.FAST_TIMINGS
CAPACITY_GIB = 24.0
MEMBERS = {
    "assistant": {"gib": 6.0, "load": 1.0, "weight": 1.0},
    "embedder": {"gib": 2.0, "load": 0.5, "weight": 1 / 2},
    "reranker": {"gib": 2.0, "load": 0.5, "weight": 1 / 3},
    "coder": {"gib": 20.0, "load": 2.0, "weight": 1 / 4},
}
TOKENS = 5


@dataclass(frozen=True)
class Arrival:
    at: float
    member: str


def trace(requests: int, seed: int, mix: str) -> list[Arrival]:
    """Bursts of Zipf-like demand (see the module's docstring), seeded; ``mix``: each
    burst is for one member (``bursts``), or each request picks its own (``interleaved``)."""
    rng = random.Random(seed)
    names = list(MEMBERS)
    weights = [MEMBERS[m]["weight"] for m in names]
    out: list[Arrival] = []
    at = 0.0
    while len(out) < requests:
        member = rng.choices(names, weights)[0]
        for _ in range(rng.randint(4, 10)):
            if mix == "interleaved":
                member = rng.choices(names, weights)[0]
            out.append(Arrival(at, member))
            at += rng.uniform(0.05, 0.15)
        at += rng.uniform(0.5, 1.5)
    return out[:requests]


@dataclass
class Result:
    pool: str
    holds: list[float] = field(default_factory=list)
    failed: int = 0
    swaps: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    utilisation: list[float] = field(default_factory=list)
    seconds: float = 0.0


class Fleet:
    """One pool of sims, a controller and a router on the shared NATS and Redis."""

    def __init__(self, workdir: Path, infra: shared.Infra) -> None:
        self.workdir, self.infra = workdir, infra
        self.stack: shared.Fleet | None = None
        self.router_url = self.controller_url = ""

    def start(self, *, capacity: bool) -> None:
        prefix = "c" + uuid.uuid4().hex[:8]
        ports = {m: free_port() for m in MEMBERS}
        pool: dict[str, Any] = {
            "name": "gpu0",
            "swapBudget": "60s",
            "leaseTtl": "3s",
            "driver": {"kind": "sim", "gpuMemoryGiB": CAPACITY_GIB},
            "members": [
                {
                    "name": m,
                    "sim": {
                        "loadSeconds": spec["load"],
                        "unloadSeconds": 0.1,
                        "memoryGiB": spec["gib"],
                        "tokensPerSecond": 50,
                        "slots": 8,
                    },
                    **({"memoryGiB": spec["gib"]} if capacity else {}),
                }
                for m, spec in MEMBERS.items()
            ],
        }
        if capacity:
            pool["capacity"] = {"gpuMemoryGiB": CAPACITY_GIB}
        config = {
            "router": {"name": "bench", "requestTimeout": "120s"},
            "backends": [
                {
                    "name": m,
                    "address": f"http://127.0.0.1:{p}",
                    "pool": {"name": "gpu0", "member": m},
                }
                for m, p in ports.items()
            ],
            "pools": [pool],
            "rules": [
                {"name": m, "match": {"models": [m]}, "route": {"backends": [m]}} for m in MEMBERS
            ],
        }
        self.stack = shared.Fleet(self.workdir, self.infra, config, prefix=prefix, env=FAST)
        self.stack.start_sims()
        controller = self.stack.start_controller()
        router = self.stack.start_router()
        self.controller_url, self.router_url = controller.url, router.url

    def stop(self) -> None:
        if self.stack is not None:
            self.stack.stop()
            self.stack = None

    async def pool(self, client: httpx.AsyncClient) -> dict[str, Any]:
        result: dict[str, Any] = (await client.get(f"{self.controller_url}/v1/pools/gpu0")).json()
        return result

    async def swaps(self, client: httpx.AsyncClient) -> dict[str, int]:
        text = (await client.get(f"{self.controller_url}/metrics")).text
        reasons: dict[str, int] = {}
        for line in text.splitlines():
            if line.startswith("hotseat_pool_swaps_started_total{"):
                labels, value = line.rsplit(" ", 1)
                reason = labels.split('reason="', 1)[1].split('"', 1)[0]
                reasons[reason] = reasons.get(reason, 0) + int(float(value))
        return reasons


def resident_gib(view: dict[str, Any]) -> float:
    names = view.get("residents") or ([view["resident"]] if view.get("resident") else [])
    return sum(MEMBERS[m]["gib"] for m in names)


async def replay(fleet: Fleet, arrivals: list[Arrival], *, capacity: bool) -> Result:
    result = Result("capacity" if capacity else "one-resident")
    fleet.start(capacity=capacity)
    try:
        async with httpx.AsyncClient(timeout=120) as http:
            while (await fleet.pool(http))["phase"] == "unknown":
                await asyncio.sleep(0.1)  # polling a state no event announces

            async def send(arrival: Arrival) -> None:
                await asyncio.sleep(max(0.0, started + arrival.at - time.monotonic()))
                body = {
                    "model": arrival.member,
                    "messages": [{"role": "user", "content": "go"}],
                    "max_tokens": TOKENS,
                }
                response = await http.post(f"{fleet.router_url}/v1/chat/completions", json=body)
                if response.status_code == 200:
                    result.holds.append(float(response.headers["x-hotseat-hold-ms"]))
                else:
                    result.failed += 1

            async def sample(stop: asyncio.Event) -> None:
                while not stop.is_set():
                    view = await fleet.pool(http)
                    result.utilisation.append(resident_gib(view) / CAPACITY_GIB)
                    try:
                        async with asyncio.timeout(0.2):
                            await stop.wait()
                    except TimeoutError:
                        pass

            started = time.monotonic()
            stop = asyncio.Event()
            sampler = asyncio.create_task(sample(stop))
            await asyncio.gather(*(send(a) for a in arrivals))
            stop.set()
            await sampler
            result.seconds = time.monotonic() - started
            result.reasons = await fleet.swaps(http)
            result.swaps = sum(n for r, n in result.reasons.items() if r != "warm_default")
    finally:
        fleet.stop()
    return result


def fewest_loads(arrivals: list[Arrival], capacity_gib: float) -> int:
    """The fewest loads any controller could serve the trace with in a capacity pool
    (first loads included), knowing the whole trace in advance and serving requests in
    the order they arrive: the residency sets that fit, and the cheapest way from set to
    set request by request (a member is loaded when it joins the set). A bound, not a
    policy: no controller sees the future; holding requests to serve them out of order
    can load less, at the price of their hold."""
    names = list(MEMBERS)
    sets = [
        frozenset(chosen)
        for size in range(len(names) + 1)
        for chosen in itertools.combinations(names, size)
        if sum(MEMBERS[m]["gib"] for m in chosen) <= capacity_gib
    ]
    unreachable = len(arrivals) * len(names) + 1
    cost = {s: 0 if not s else unreachable for s in sets}
    for arrival in arrivals:
        cost = {
            s: min(cost[p] + len(s - p) for p in sets) if arrival.member in s else unreachable
            for s in sets
        }
    return min(cost.values())


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def report(result: Result, requests: int) -> None:
    per100 = 100 * result.swaps / max(1, requests)
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(result.reasons.items()))
    util = statistics.mean(result.utilisation) if result.utilisation else float("nan")
    print(
        f"  {result.pool:<13} requests {requests} (failed {result.failed})  swaps"
        f" {result.swaps:3d} = {per100:5.1f}/100 req  [{reasons}]  ({result.seconds:.0f} s)\n"
        f"  {'':<13} hold ms p50 {pct(result.holds, 50):6.0f}  p99 {pct(result.holds, 99):6.0f}"
        f"  max {max(result.holds, default=float('nan')):6.0f}"
        f"  mean {statistics.mean(result.holds) if result.holds else float('nan'):6.0f}"
        f"   GPU memory in use: mean {util:.0%} of {CAPACITY_GIB:g} GiB"
        f" ({len(result.utilisation)} samples)"
    )


async def main_async(args: argparse.Namespace) -> None:
    MEMBERS["coder"]["gib"] = args.coder_gib
    arrivals = trace(args.requests, args.seed, args.mix)
    counts = {m: sum(1 for a in arrivals if a.member == m) for m in MEMBERS}
    sizes = {m: spec["gib"] for m, spec in MEMBERS.items()}
    print(
        f"trace ({args.mix}): {len(arrivals)} requests over {arrivals[-1].at:.0f} s,"
        f" {counts}; GiB {sizes}"
    )
    changes = sum(1 for i, a in enumerate(arrivals) if i == 0 or a.member != arrivals[i - 1].member)
    best = fewest_loads(arrivals, CAPACITY_GIB)
    print(
        f"bounds: {changes} changes of member in the trace (a one-resident pool loads at"
        f" most once per change); a capacity pool serving in arrival order needs at least"
        f" {best} loads (first loads included, even knowing the whole trace)"
    )
    with tempfile.TemporaryDirectory(prefix="hotseat-capacity-") as tmp:
        workdir = Path(tmp)
        infra = shared.start_infra(workdir)
        try:
            results = []
            for capacity in (False, True):
                result = await replay(Fleet(workdir, infra), arrivals, capacity=capacity)
                report(result, len(arrivals))
                results.append(result)
            one, cap = results
            if cap.swaps:
                print(f"swaps: {one.swaps / cap.swaps:.1f}x fewer in the capacity pool")
        finally:
            infra.stop()


def main() -> None:
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--coder-gib", type=float, default=MEMBERS["coder"]["gib"])
    parser.add_argument("--mix", choices=("bursts", "interleaved"), default="bursts")
    args = parser.parse_args()
    print(f"load average at the start {os.getloadavg()[0]:.1f}")
    asyncio.run(main_async(args))
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
