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
traffic, so the per-request figure is given both raw and net of it. Each line also gives
how busy this process was driving the traffic (its CPU time over the run's): near 100%,
it set the pace, and the gaps it left in each router's traffic cost acquires (a router
releases its lease when its last request ends).

Wake-up: ``--held N`` requests for the pool's other member are sent at once; the swap
they cause commits, and one sample is the time from the commit (the ``swap_completed``
audit event's time, taken by the controller right after the commit's script returned) to
the first held request's arrival at the member (its own request log, which times a
request by the moment its head reached the sim's app, before the sim routes it or reads
its body), another to its ``serve_start`` in the sims' ledger (millisecond resolution:
the sim's own routing, parsing and admission of all the held requests come before it):
one host, one clock, read by the processes that lived each moment. The client's view
(this process receiving the commit's notification, then the first held response's
headers) is printed beside them: the held streams load this process, so it is late to
both. So is the commit to its state-change notification received here (this host's
clock both ends; the held requests are all waiting then, so this process is seldom
busy). The pool then swaps back, ``--swaps`` times; ``--matrix ""`` runs the wake-up
alone.

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
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis
from fleet import Fleet, Infra, sim_backend, start_infra

from hotseat.launcher import Managed, free_port
from hotseat_common.connections import open_nats
from hotseat_common.keys import Keys
from hotseat_common.messages import AuditEvent, PoolOutcome, PoolStateChanged
from hotseat_common.subjects import Subjects
from hotseat_sim.timeline import read_timeline

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
            name = f"p{p}{m}"
            backends.append(sim_backend(name, ports.get(name) or free_port(), f"gpu{p}", m))
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
class Scaled:
    infra: Infra
    fleet: Fleet
    controllers: list[Managed]
    routers: list[Managed]

    def stop(self) -> None:
        self.fleet.stop()
        self.infra.stop()


def start_fleet(work: Path, routers: int, controllers: int, pools: int) -> Scaled:
    infra = start_infra(work, monitor=True, sims_redis=True)
    ports = {"p0a": free_port(), "p0b": free_port()}
    fleet = Fleet(work, infra, config(pools, ports), prefix=PREFIX)
    try:
        fleet.start_sims(ports)
        ctl = [fleet.start_controller(f"controller-{i}", ["--instance", f"c{i}"])
               for i in range(controllers)]  # fmt: skip
        rtr = [fleet.start_router(f"router-{i}", ["--instance", f"r{i}"]) for i in range(routers)]
    except BaseException:
        fleet.stop()
        infra.stop()
        raise
    return Scaled(infra, fleet, ctl, rtr)


@dataclass
class Tally:
    """Counters read at one moment: Redis commands by name, NATS messages in and out, and
    (for ``--breakdown``) messages delivered per subscribed subject (``/subsz``) and
    published per client connection (``/connz``, by connection name)."""

    redis: Counter[str]
    nats_in: int
    nats_out: int
    subjects: Counter[str]
    clients: Counter[str]

    @property
    def commands(self) -> int:
        return sum(self.redis.values())

    def __sub__(self, other: Tally) -> Tally:
        return Tally(
            self.redis - other.redis,
            self.nats_in - other.nats_in,
            self.nats_out - other.nats_out,
            self.subjects - other.subjects,
            self.clients - other.clients,
        )


async def tally(client: aioredis.Redis, http: httpx.AsyncClient, monitor: str) -> Tally:
    stats = await client.info("commandstats")
    redis = Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})
    redis["info"] -= 1  # this read's own INFO
    varz = (await http.get(monitor + "/varz")).json()
    subsz = (await http.get(monitor + "/subsz", params={"subs": 1, "limit": 100000})).json()
    subjects: Counter[str] = Counter()
    for sub in subsz.get("subscriptions_list") or []:
        subjects[sub["subject"].removeprefix(PREFIX + ".")] += int(sub.get("msgs", 0))
    connz = (await http.get(monitor + "/connz", params={"limit": 100000})).json()
    clients: Counter[str] = Counter()
    for conn in connz.get("connections") or []:
        clients[conn.get("name") or "?"] += int(conn["in_msgs"])
    return Tally(redis, int(varz["in_msgs"]), int(varz["out_msgs"]), subjects, clients)


def breakdown(label: str, counter: Counter[str], n: int) -> str:
    top = sorted(counter.items(), key=lambda kv: -kv[1])[:12]
    return f"    {label}: " + ", ".join(f"{k} {v / n:.2f}" for k, v in top if v > 0)


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
    fleet = start_fleet(work, routers, controllers, pools)
    monitor = fleet.infra.monitor
    assert monitor is not None
    try:
        client = aioredis.from_url(fleet.infra.redis.url)
        urls = [r.url for r in fleet.routers]
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=200)) as http:
            await drive(http, urls, "a", 50 * routers, min(args.concurrency, 4))  # warm-up
            await asyncio.sleep(2)
            t0 = await tally(client, http, monitor)
            cpu = time.process_time()
            seconds = await drive(http, urls, "a", args.requests, args.concurrency)
            # How busy this process was driving the traffic: near 100%, it set the pace,
            # and the routers saw gaps it made (more acquires per request).
            driver_busy = (time.process_time() - cpu) / seconds
            t1 = await tally(client, http, monitor)
            # The background over as long, with no traffic (leases released, pools quiet).
            await asyncio.sleep(3)
            t2 = await tally(client, http, monitor)
            await asyncio.sleep(seconds)
            t3 = await tally(client, http, monitor)
        await client.aclose()
        n = args.requests
        busy, idle = t1 - t0, t3 - t2
        print(
            f"  {routers} router(s), {controllers} controller(s), {pools:>3} pool(s):"
            f" Redis {busy.commands / n:6.2f}/req"
            f" (net of idle {(busy.commands - idle.commands) / n:6.2f})"
            f"  NATS in {busy.nats_in / n:5.2f}/req (net {(busy.nats_in - idle.nats_in) / n:5.2f})"
            f"  out {busy.nats_out / n:5.2f}/req"
            f" (net {(busy.nats_out - idle.nats_out) / n:5.2f})"
            f"  acquires {busy.subjects['pool.acquire'] / n:4.2f}/req"
            f"  [{n / seconds:.0f} req/s, this process busy {driver_busy:.0%};"
            f" idle over {seconds:.1f} s: Redis {idle.commands}, NATS in {idle.nats_in}]",
            flush=True,
        )
        if args.breakdown:
            print(breakdown("Redis/req", busy.redis, n))
            print(breakdown("idle Redis/req", idle.redis, n))
            print(breakdown("NATS delivered/req by subject", busy.subjects, n))
            print(breakdown("NATS published/req by client", busy.clients, n), flush=True)
    finally:
        fleet.stop()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def first_serve(ledger: aioredis.Redis, member: str, since: float) -> float:
    """When ``member`` first began to serve a request at or after ``since`` (the sims'
    ledger: Redis stream ids, milliseconds of this host's clock). The sims write their
    ledger from a task of their own, so the entry may land after the response: read
    until it is there."""
    deadline = time.monotonic() + 10
    while True:
        timeline = await read_timeline(ledger, Keys(PREFIX), "gpu0")
        starts = [
            e.time for e in timeline if e.event == "serve_start" and e.member == member
            and e.time >= since - 0.001
        ]  # fmt: skip
        if starts or time.monotonic() > deadline:
            return min(starts)
        await asyncio.sleep(0.05)  # polling the ledger until the sim's write lands


def sim_url(fleet: Fleet, member: str) -> str:
    backend = next(b for b in fleet.config["backends"] if b["name"] == f"p0{member}")
    return str(backend["address"])


async def wake_up(args: argparse.Namespace, held: int) -> None:
    """``held`` requests for the other member, ``--swaps`` times. Every time is this host's
    clock (``time.time()``) as the process that lived the moment read it: the commit from
    the ``swap_completed`` audit event (its time is taken right after the commit's script
    returned), the first held request's arrival from the member's own request log (its
    head at the sim's app), its ``serve_start`` from the sims' ledger; and, for
    comparison, the client's view in this process, which the ``held`` streams load: the
    commit's notification received to the first held response's headers."""
    work = Path(tempfile.mkdtemp(prefix="hotseat-wake-"))
    fleet = start_fleet(work, 1, 1, 1)
    nc = await open_nats(fleet.infra.nats.url)
    subjects = Subjects(PREFIX)
    try:
        url = fleet.routers[0].url
        commits: dict[str, asyncio.Future[float]] = {}
        announced: dict[str, float] = {}  # member -> the commit's notification here (time.time)
        committed_at: dict[str, asyncio.Future[float]] = {}

        async def on_change(msg: Any) -> None:
            changed = PoolStateChanged.from_bytes(msg.data)
            future = commits.get(changed.resident or "")
            if changed.phase == "idle" and future is not None and not future.done():
                future.set_result(time.monotonic())
                announced[changed.resident or ""] = time.time()

        async def on_commit(msg: Any) -> None:
            event = AuditEvent.from_bytes(msg.data)
            future = committed_at.get(event.to_member or event.member or "")
            if future is not None and not future.done():
                future.set_result(event.time.timestamp())

        await nc.subscribe(subjects.pool_events("gpu0"), cb=on_change)
        await nc.subscribe(subjects.audit("pool", PoolOutcome.SWAP_COMPLETED), cb=on_commit)
        assert fleet.infra.sims_redis is not None
        ledger = aioredis.from_url(fleet.infra.sims_redis.url)
        client_view: list[float] = []
        notified: list[float] = []
        arrivals: list[float] = []
        serves: list[float] = []
        limits = httpx.Limits(max_connections=held + 10, max_keepalive_connections=held + 10)
        async with httpx.AsyncClient(limits=limits, timeout=120) as http:
            await drive(http, [url], "a", 5, 1)
            member = "a"
            for _ in range(args.swaps):
                member = "b" if member == "a" else "a"
                loop = asyncio.get_running_loop()
                commits[member] = loop.create_future()
                committed_at[member] = loop.create_future()
                first: asyncio.Future[float] = loop.create_future()
                sim = sim_url(fleet.fleet, member)
                (await http.delete(sim + "/debug/requests")).raise_for_status()

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
                commit = await committed_at[member]
                client_view.append(first.result() - await commits[member])
                notified.append(announced[member] - commit)
                seen = (await http.get(sim + "/debug/requests")).json()["requests"]
                arrivals.append(min(r["time"] for r in seen) - commit)
                serves.append(await first_serve(ledger, member, commit) - commit)

        def figures(values: list[float]) -> str:
            return f"p50 {pct(values, 0.5) * 1e3:6.1f} ms  p99 {pct(values, 0.99) * 1e3:6.1f} ms"

        print(
            f"  {held:>3} held, commit -> first held request received by the member"
            f" {figures(arrivals)};  -> its serve_start (ledger, 1 ms) {figures(serves)};"
            f"  client's view {figures(client_view)};  commit -> its notification here"
            f" {figures(notified)}  ({len(arrivals)} swaps)",
            flush=True,
        )
    finally:
        await nc.close()
        await ledger.aclose()
        fleet.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--matrix", default="1,1,1 2,1,1 4,1,1 1,2,1 1,1,10 1,1,100")
    parser.add_argument("--held", default="1,10,100")
    parser.add_argument("--swaps", type=int, default=10)
    parser.add_argument(
        "--breakdown", action="store_true", help="counts by command, subject and client"
    )
    args = parser.parse_args()
    if args.matrix:
        print(f"== per pooled request ({args.requests} requests, {args.concurrency} in flight)")
        for cell in args.matrix.split():
            routers, controllers, pools = (int(x) for x in cell.split(","))
            await counts(args, routers, controllers, pools)
    if args.held:
        print("== wake-up of held requests (swap commit -> first held request at the member)")
        for held in (int(x) for x in args.held.split(",")):
            await wake_up(args, held)


if __name__ == "__main__":
    asyncio.run(main())
