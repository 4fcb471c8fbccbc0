"""The scheduler against recorded-style workloads (docs/adr/0006): each trace replayed
through a real router, controller and sims, once with the pool's defaults (sticky
residency, first come first served) and once with the scheduler's knobs on, printing
swaps per 100 requests, hold times (p50/p99/max, from ``x-hotseat-hold-ms``) per member
or class of request, and what the trace is about.

Traces (sim loads: planner 1 s, coder 2 s, small 0.5 s, large 2 s):

- ``agents``: three agents, each alternating a planner and a coder model every
  ``--turn`` requests (1 and 3), short requests, one at a time per agent. Target: the
  scheduler does not swap more, nor hold longer (p99, mean), than the defaults.
- ``batch``: a batch user keeps three long streams (2 s each) on ``large`` back to back
  while an interactive user sends a short request to ``small`` every 2 s for 40 s (the
  pool's swapBudget is 30 s). Target (issue): with ``maxWait: 5s`` no interactive request
  held longer than ``maxWait`` plus one swap (printed: the measured mean swap to each
  member, unload to ready); the contract's own bound adds the longest batch stream
  running at the close (never cut), which closing early by the measured drain
  (docs/adr/0006) works to remove. The defaults hold it until the batch leaves a gap, or
  answer 503 at the budget.
- ``priority``: bursts of requests for two low priority members and one high priority
  member (priority 5, rule level). Target: the high priority p99 hold at most one swap
  time, and every low priority request completes. A swap a low request started is
  retargeted to high while it is still unloading (printed as ``retargeted``); a low
  member found resident serves its own requests of the burst first (never cut).
- ``quiet``: a request now and then, with ``idleUnloadAfter: 3s`` and a default member.
  Target: members are unloaded once idle and the default comes back.

    .venv/bin/python bench/scheduler_trace.py [--trace agents,batch,priority,quiet] [--scale 1]

A measurement, not a test: counts (swaps, requests) are what noise cannot move; read the
times with the machine's load beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import fleet as shared  # noqa: E402

from hotseat.launcher import free_port  # noqa: E402

FAST = shared.FAST_TIMINGS
MEMBERS = {
    "planner": {"loadSeconds": 1.0, "tokensPerSecond": 50, "memoryGiB": 8},
    "coder": {"loadSeconds": 2.0, "tokensPerSecond": 50, "memoryGiB": 20},
    "small": {"loadSeconds": 0.5, "tokensPerSecond": 50, "memoryGiB": 4},
    "large": {"loadSeconds": 2.0, "tokensPerSecond": 50, "memoryGiB": 20},
    "low-a": {"loadSeconds": 1.0, "tokensPerSecond": 50, "memoryGiB": 8},
    "low-b": {"loadSeconds": 1.0, "tokensPerSecond": 50, "memoryGiB": 8},
    "high": {"loadSeconds": 1.0, "tokensPerSecond": 50, "memoryGiB": 8},
}


@dataclass
class Done:
    member: str
    label: str
    status: int
    hold_ms: float
    sent: float


@dataclass
class Run:
    trace: str
    policy: str
    done: list[Done] = field(default_factory=list)
    swaps: int = 0
    swap_reasons: dict[str, int] = field(default_factory=dict)
    retargets: int = 0
    """Swaps that turned to a more urgent member before their load (docs/adr/0006)."""
    swap_s: dict[str, float] = field(default_factory=dict)
    """Mean measured swap (unload to ready) per member loaded, completed swaps only."""
    resident_at_end: str | None = None
    seconds: float = 0.0


class Fleet:
    """One pool of sims, a controller and a router on private NATS and Redis."""

    def __init__(self, workdir: Path, infra: shared.Infra) -> None:
        self.workdir, self.infra = workdir, infra
        self.stack: shared.Fleet | None = None
        self.router_url = self.controller_url = ""

    def start(self, members: list[str], pool: dict[str, Any], rules: list[dict[str, Any]]) -> None:
        prefix = "t" + uuid.uuid4().hex[:8]
        ports = {m: free_port() for m in members}
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
            "pools": [
                {
                    "name": "gpu0",
                    "swapBudget": "30s",
                    "leaseTtl": "3s",
                    "driver": {"kind": "sim", "gpuMemoryGiB": 24},
                    "members": [
                        {"name": m, "sim": {**MEMBERS[m], "unloadSeconds": 0.1, "slots": 8}}
                        for m in members
                    ],
                    **pool,
                }
            ],
            "rules": rules,
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

    async def pool(self) -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.get(f"{self.controller_url}/v1/pools/gpu0")
            result: dict[str, Any] = response.json()
            return result

    async def wait_known(self) -> None:
        while (await self.pool())["phase"] == "unknown":
            await asyncio.sleep(0.1)  # polling a state no event announces

    async def swaps(self) -> tuple[dict[str, int], int, dict[str, float]]:
        """Swaps started, by reason, swaps retargeted before their load, and the mean
        completed swap per member loaded (the controller's metrics)."""
        async with httpx.AsyncClient(timeout=10) as client:
            text = (await client.get(f"{self.controller_url}/metrics")).text
        reasons: dict[str, int] = defaultdict(int)
        retargets = 0
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, float] = defaultdict(float)
        for line in text.splitlines():
            for suffix, into in (("_sum{", sums), ("_count{", counts)):
                if line.startswith("hotseat_pool_swap_duration_seconds" + suffix) and (
                    'result="completed"' in line
                ):
                    labels, value = line.rsplit(" ", 1)
                    member = labels.split('to_member="', 1)[1].split('"', 1)[0]
                    into[member] += float(value)
            if line.startswith("hotseat_pool_swaps_started_total{"):
                labels, value = line.rsplit(" ", 1)
                reason = labels.split('reason="', 1)[1].split('"', 1)[0]
                reasons[reason] += int(float(value))
            if line.startswith("hotseat_pool_swap_retargets_total{"):
                retargets += int(float(line.rsplit(" ", 1)[1]))
        means = {m: sums[m] / n for m, n in counts.items() if n}
        return dict(reasons), retargets, means


class Client:
    def __init__(self, url: str, run: Run) -> None:
        self.url = url
        self.run = run
        self.http = httpx.AsyncClient(timeout=120)

    async def request(self, model: str, tokens: int, label: str, **headers: str) -> None:
        sent = time.monotonic()
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "go"}],
            "max_tokens": tokens,
        }
        response = await self.http.post(
            f"{self.url}/v1/chat/completions", json=body, headers=headers
        )
        hold = float(response.headers.get("x-hotseat-hold-ms", "nan"))
        self.run.done.append(Done(model, label, response.status_code, hold, sent))


# --- traces ---------------------------------------------------------------------------


async def agents(client: Client, scale: float, turn: int) -> None:
    async def agent(index: int) -> None:
        await asyncio.sleep(index * 0.3)  # staggered starts, as agents are
        for step in range(round(24 * scale)):
            model = "planner" if (step // turn) % 2 == 0 else "coder"
            await client.request(model, 10, model)

    await asyncio.gather(*(agent(i) for i in range(3)))


async def batch(client: Client, scale: float) -> None:
    stop = asyncio.Event()

    async def batch_worker(offset: float) -> None:
        await asyncio.sleep(offset)
        while not stop.is_set():
            await client.request("large", 100, "batch")  # 2 s at 50 tokens/s

    async def interactive() -> None:
        # A request every 2 s for 40 s of trace, whether or not the last one was served.
        sent: list[asyncio.Task[None]] = []
        for _ in range(round(20 * scale)):
            sent.append(asyncio.create_task(client.request("small", 5, "interactive")))
            await asyncio.sleep(2.0)
        await asyncio.gather(*sent)
        stop.set()

    await asyncio.gather(interactive(), *(batch_worker(i * 0.7) for i in range(3)))


async def priority(client: Client, scale: float) -> None:
    async def burst() -> None:
        low = [client.request(m, 20, "low") for m in ("low-a", "low-b") for _ in range(3)]
        high = [client.request("high", 5, "high") for _ in range(2)]
        await asyncio.gather(*low, *high)

    for _ in range(round(6 * scale)):
        started = time.monotonic()
        await burst()
        await asyncio.sleep(max(0.0, 3.0 - (time.monotonic() - started)))


async def quiet(client: Client, scale: float) -> None:
    for model, pause in [("coder", 6), ("planner", 2), ("coder", 8), ("coder", 1)] * round(
        2 * scale
    ):
        await client.request(model, 5, model)
        await asyncio.sleep(pause)  # the quiet between requests is the trace itself
    await asyncio.sleep(5)  # the last idle period, long enough for idleUnloadAfter


TRACES: dict[str, dict[str, Any]] = {
    "agents-1": {
        "members": ["planner", "coder"],
        "run": lambda c, s: agents(c, s, 1),
        "scheduler": {"maxWait": "5s"},
    },
    "agents-3": {
        "members": ["planner", "coder"],
        "run": lambda c, s: agents(c, s, 3),
        "scheduler": {"maxWait": "5s"},
    },
    "batch": {"members": ["small", "large"], "run": batch, "scheduler": {"maxWait": "5s"}},
    "priority": {
        "members": ["low-a", "low-b", "high"],
        "run": priority,
        "rules": {"high": 5},
        "scheduler": {"maxWait": "5s"},
    },
    "quiet": {
        "members": ["planner", "coder"],
        "run": quiet,
        "pool": {"default": "planner"},
        "scheduler": {"idleUnloadAfter": "3s"},
    },
}


def rules_for(members: list[str], priorities: dict[str, int]) -> list[dict[str, Any]]:
    return [
        {
            "name": m,
            "match": {"models": [m]},
            "route": {"backends": [m]},
            "priority": priorities.get(m, 0),
        }
        for m in members
    ]


async def replay(fleet: Fleet, name: str, policy: str, scale: float) -> Run:
    trace = TRACES[name]
    pool = dict(trace.get("pool", {}))
    if policy == "scheduler":
        pool.update(trace["scheduler"])
    rules = rules_for(trace["members"], trace.get("rules", {}) if policy == "scheduler" else {})
    fleet.start(trace["members"], pool, rules)
    run = Run(name, policy)
    try:
        await fleet.wait_known()
        client = Client(fleet.router_url, run)
        started = time.monotonic()
        runner: Callable[[Client, float], Awaitable[None]] = trace["run"]
        await runner(client, scale)
        run.seconds = time.monotonic() - started
        await client.http.aclose()
        run.swap_reasons, run.retargets, run.swap_s = await fleet.swaps()
        run.swaps = sum(n for r, n in run.swap_reasons.items() if r != "warm_default")
        run.resident_at_end = (await fleet.pool())["resident"]
    finally:
        fleet.stop()
    return run


# --- report -----------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def report(run: Run) -> None:
    ok = [d for d in run.done if d.status == 200]
    failed = len(run.done) - len(ok)
    per100 = 100 * run.swaps / max(1, len(run.done))
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(run.swap_reasons.items()))
    print(
        f"  {run.policy:<9} requests {len(run.done):4d} (failed {failed})  swaps {run.swaps:3d}"
        f" = {per100:5.1f}/100 req  [{reasons}]  retargeted {run.retargets}"
        f"  resident at end: {run.resident_at_end}"
        f"  ({run.seconds:.0f} s)"
    )
    if run.swap_s:
        means = ", ".join(f"{m} {1000 * s:.0f}" for m, s in sorted(run.swap_s.items()))
        print(f"      mean swap ms (unload to ready, by member loaded): {means}")
    by_label: dict[str, list[float]] = defaultdict(list)
    for d in ok:
        by_label[d.label].append(d.hold_ms)
    for label, holds in sorted(by_label.items()):
        mean = statistics.mean(holds)
        print(
            f"      {label:<12} n {len(holds):4d}  hold ms p50 {pct(holds, 50):8.0f}"
            f"  p99 {pct(holds, 99):8.0f}  max {max(holds):8.0f}  mean {mean:8.0f}"
        )


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="hotseat-trace-") as tmp:
        workdir = Path(tmp)
        infra = shared.start_infra(workdir)
        try:
            for name in args.trace.split(","):
                print(f"\ntrace {name}:", flush=True)
                for policy in ("defaults", "scheduler"):
                    fleet = Fleet(workdir, infra)
                    report(await replay(fleet, name, policy, args.scale))
        finally:
            infra.stop()


def main() -> None:
    # A SIGTERM unwinds like Ctrl-C, so every fleet's processes are stopped on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default=",".join(TRACES))
    parser.add_argument("--scale", type=float, default=1.0, help="length of each trace")
    args = parser.parse_args()
    print(f"load average at the start {os.getloadavg()[0]:.1f}")
    asyncio.run(main_async(args))
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
