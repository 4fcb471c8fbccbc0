"""Fleet placement against static ordered backends (docs/adr/0012): the same demand over
1, 4 and 16 one-resident sim pools that can each hold ``assistant`` or ``coder``, once
with each model a model group over every pool (placed per request) and once as today's
only way: a rule listing the model's backends on every pool in a fixed order (Wait).

Demand (seeded, the same for both): ``--concurrency`` clients in a closed loop, each
request for assistant or coder with Zipf-like weights (1 and 1/2), 5 tokens each. Sims:
0.5 s load, 0.1 s unload, 50 tokens/s, 4 slots (the groups' ``slots``).

Prints, per fleet size and kind: requests/s, hold p50/p99 (``x-hotseat-hold-ms``), swaps
started by demand per 100 requests, the requests that waited for a load (held 250 ms or
more) (the controller's ``hotseat_pool_swaps_started_total``
without the warm-up), and Redis commands (the controllers' Redis, ``INFO commandstats``,
scripts' inner commands included; the sims keep their ledger in a Redis of their own)
and NATS messages in (``/varz``) per request: raw (everything counted during the run)
and net of the idle background. The background is what the same stack costs with no
request: the supervisors' ticks, heartbeats and copy entries, which grow with the
pools and not with the requests. It is measured on the same stack over a quiet window
after the run (``--idle-seconds``, once the last leases have ended), as a rate, and the
net count is ``(raw - rate x run time) / requests``.

    .venv/bin/python bench/fleet_placement.py [--pools 1,4,16] [--requests 300]
        [--idle-seconds 20] [--models assistant] [--by-command]

A measurement, not a test: counts are what noise cannot move; read the times with the
machine's load beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import fleet as shared  # noqa: E402

from hotseat.launcher import free_port  # noqa: E402

MODELS = {"assistant": 1.0, "coder": 0.5}
SIM = {"loadSeconds": 0.5, "unloadSeconds": 0.1, "tokensPerSecond": 50, "slots": 4}
TOKENS = 5
WAITED_MS = 250.0
"""A request held at least this long waited for a load (half a sim's load time): the
``waited`` column counts them (each re-asks the controller while it waits)."""


def config(pools: int, *, grouped: bool) -> dict[str, Any]:
    names = [f"gpu{i}" for i in range(pools)]
    backends = [shared.sim_backend(f"{p}-{m}", free_port(), p, m) for p in names for m in MODELS]
    out: dict[str, Any] = {
        "router": {"name": "bench", "requestTimeout": "120s"},
        "backends": backends,
        "pools": [
            {
                "name": p,
                "swapBudget": "60s",
                "leaseTtl": "3s",
                "driver": {"kind": "sim"},
                "members": [{"name": m, "sim": SIM} for m in MODELS],
            }
            for p in names
        ],
    }
    if grouped:
        out["modelGroups"] = [
            {
                "name": m,
                "maxCopies": pools,
                "members": [{"backend": f"{p}-{m}", "slots": SIM["slots"]} for p in names],
            }
            for m in MODELS
        ]
        out["rules"] = [
            {"name": m, "match": {"models": [m]}, "route": {"backends": [m]}} for m in MODELS
        ]
    else:
        out["rules"] = [
            {
                "name": m,
                "match": {"models": [m]},
                "route": {"backends": [f"{p}-{m}" for p in names]},
            }
            for m in MODELS
        ]
    return out


@dataclass
class Run:
    holds: list[float] = field(default_factory=list)
    failed: int = 0
    seconds: float = 0.0
    swaps: int = 0
    redis: int = 0
    nats_in: int = 0
    idle_redis_s: float = 0.0
    """Redis commands per second with no request (the quiet window after the run)."""
    idle_nats_s: float = 0.0
    """NATS messages in per second with no request."""
    by_command: Counter[str] = field(default_factory=Counter)
    """Redis calls per command during the run."""
    idle_by_command: Counter[str] = field(default_factory=Counter)
    """Redis calls per command during the quiet window."""
    idle_window: float = 0.0
    """The quiet window's length (s)."""

    def net(self, raw: int, per_s: float, n: int) -> float:
        """Per request, net of the idle background over the run's time."""
        return (raw - per_s * self.seconds) / n


LAST_BY_COMMAND: Counter[str] = Counter()
"""Redis calls per command at the last :func:`counters` read (for ``--by-command``)."""


async def counters(
    client: aioredis.Redis, http: httpx.AsyncClient, monitor: str
) -> tuple[int, int]:
    stats = await client.info("commandstats")
    LAST_BY_COMMAND.clear()
    LAST_BY_COMMAND.update({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})
    commands = sum(int(v["calls"]) for v in stats.values()) - 1  # this read's own INFO
    varz = (await http.get(monitor + "/varz")).json()
    return commands, int(varz["in_msgs"])


async def swaps(http: httpx.AsyncClient, controller: str) -> int:
    text = (await http.get(f"{controller}/metrics")).text
    total = Counter[str]()
    for line in text.splitlines():
        if line.startswith("hotseat_pool_swaps_started_total{"):
            labels, value = line.rsplit(" ", 1)
            reason = labels.split('reason="', 1)[1].split('"', 1)[0]
            total[reason] += int(float(value))
    return sum(v for k, v in total.items() if k != "warm_default")


async def one(args: argparse.Namespace, infra: shared.Infra, pools: int, *, grouped: bool) -> Run:
    work = Path(tempfile.mkdtemp(prefix="hotseat-placement-"))
    stack = shared.Fleet(
        work, infra, config(pools, grouped=grouped), prefix="f" + uuid.uuid4().hex[:8],
        env={**shared.FAST_TIMINGS, **({"HOTSEAT_TICK_INTERVAL": str(args.tick_interval)}
                                      if args.tick_interval else {})},
    )  # fmt: skip
    run = Run()
    try:
        stack.start_sims()
        controller = stack.start_controller().url
        router = stack.start_router().url
        monitor = infra.monitor
        assert monitor is not None
        client = aioredis.from_url(infra.redis.url)
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=100)) as http:
            while any(
                p["phase"] == "unknown"
                for p in (await http.get(f"{controller}/v1/pools")).json()["pools"]
            ):
                await asyncio.sleep(0.1)  # polling a state no event announces
            rng = random.Random(args.seed)
            asked = {m: MODELS[m] for m in args.models.split(",")}
            wanted = rng.choices(list(asked), list(asked.values()), k=args.requests)
            queue = list(reversed(wanted))
            before_swaps = await swaps(http, controller)
            r0, n0 = await counters(client, http, monitor)
            c0 = Counter(LAST_BY_COMMAND)
            started = time.monotonic()

            async def worker() -> None:
                while queue:
                    model = queue.pop()
                    body = {"model": model, "messages": [{"role": "user", "content": "go"}],
                            "max_tokens": TOKENS}  # fmt: skip
                    response = await http.post(f"{router}/v1/chat/completions", json=body)
                    if response.status_code == 200:
                        run.holds.append(float(response.headers.get("x-hotseat-hold-ms", 0)))
                    else:
                        run.failed += 1

            await asyncio.gather(*(worker() for _ in range(args.concurrency)))
            run.seconds = time.monotonic() - started
            r1, n1 = await counters(client, http, monitor)
            run.by_command = Counter(LAST_BY_COMMAND) - c0
            run.swaps = await swaps(http, controller) - before_swaps
            run.redis, run.nats_in = r1 - r0, n1 - n0
            # The quiet window: the same stack with no request, once the run's last
            # leases have ended (a bench waits out a lease time; nothing announces it).
            await asyncio.sleep(args.settle_seconds)
            i0, m0 = await counters(client, http, monitor)
            c0 = Counter(LAST_BY_COMMAND)
            quiet = time.monotonic()
            await asyncio.sleep(args.idle_seconds)
            i1, m1 = await counters(client, http, monitor)
            run.idle_by_command = Counter(LAST_BY_COMMAND) - c0
            window = run.idle_window = time.monotonic() - quiet
            run.idle_redis_s, run.idle_nats_s = (i1 - i0) / window, (m1 - m0) / window
        await client.aclose()
    finally:
        stack.stop()
    return run


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values) or [0.0]
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pools", default="1,4,16")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--idle-seconds", type=float, default=20.0,
                        help="the quiet window that measures the idle background")  # fmt: skip
    parser.add_argument("--tick-interval", type=float, default=None,
                        help="supervisor tick of a busy pool (default 0.1 s)")  # fmt: skip
    parser.add_argument("--models", default=",".join(MODELS),
                        help="the models asked for (every pool can hold both)")  # fmt: skip
    parser.add_argument("--by-command", action="store_true",
                        help="also print Redis calls per request by command")  # fmt: skip
    parser.add_argument("--settle-seconds", type=float, default=5.0,
                        help="wait after the run before the quiet window (leases end)")  # fmt: skip
    args = parser.parse_args()
    infra = shared.start_infra(Path(tempfile.mkdtemp(prefix="hotseat-infra-")), monitor=True,
                               sims_redis=True)  # fmt: skip
    try:
        for pools in (int(p) for p in args.pools.split(",")):
            for grouped in (False, True):
                run = await one(args, infra, pools, grouped=grouped)
                n = len(run.holds) + run.failed
                kind = "model groups" if grouped else "static order"
                print(
                    f"{pools:>3} pool(s) {kind:>13}: {n / run.seconds:6.1f} req/s"
                    f"  hold p50 {pct(run.holds, 0.5):6.0f} ms  p99 {pct(run.holds, 0.99):6.0f} ms"
                    f"  swaps/100 {100 * run.swaps / n:5.1f}  failed {run.failed}"
                    f"  waited {sum(h >= WAITED_MS for h in run.holds):3d}"
                    f"  Redis {run.redis / n:6.2f}/req  NATS in {run.nats_in / n:5.2f}/req"
                    f"  idle: Redis {run.idle_redis_s:6.1f}/s  NATS in {run.idle_nats_s:5.1f}/s"
                    f"  net: Redis {run.net(run.redis, run.idle_redis_s, n):6.2f}/req"
                    f"  NATS in {run.net(run.nats_in, run.idle_nats_s, n):5.2f}/req",
                    flush=True,
                )
                if args.by_command:
                    top = run.by_command.most_common(12)
                    idle, share = run.idle_by_command, run.seconds / run.idle_window / n
                    print(
                        "      per request (raw / idle share):  "
                        + "  ".join(f"{c} {v / n:.1f}/{idle[c] * share:.1f}" for c, v in top),
                        flush=True,
                    )
    finally:
        infra.stop()


if __name__ == "__main__":
    asyncio.run(main())
