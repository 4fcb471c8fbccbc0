"""Chaos soak: a whole Hotseat fleet under mixed traffic while its processes are killed.

Two routers, two pool controllers and the audit service (on PostgreSQL), two pools of two
sim members each, private NATS, a private Redis for the controllers' pool store and
another for the sims' GPU ledger (the oracle's truth must survive what happens to the
store). Concurrent clients send a mix of Wait and IfIdle requests, streaming and not, some
of them reusing a handful of client request ids across routers at once, for a fixed
duration, while a chaos loop every few seconds does one of:

- SIGKILL a random router, controller or the audit service, and start it again;
- SIGKILL the pool store's Redis and start it again empty on the same port;
- SIGSTOP a random sim backend for one to three seconds (a stalled GPU server), then
  SIGCONT it.

The second router runs with its wall clock 90 s behind (libfaketime, when installed).
At the end it prints requests by status, faults, swaps, busy skips, audit events
published (accepted by JetStream) against stored, the swaps' ends, and the full GPU ledger
verdict of both pools (no overlap, no member unloaded while serving, no request cut, no
lost ledger write), and exits non-zero on any ledger violation, lost or duplicated audit
event, swap started and never ended (neither in flight when the fleet stopped nor ended
by a controller that was killed before JetStream acknowledged the end) or ended twice,
cut stream or 503 without Retry-After.

Run: ``.venv/bin/python bench/soak.py --duration 150`` (``make soak``; ``--ci`` is a
one-minute run for CI). Needs PostgreSQL at ``HOTSEAT_TEST_POSTGRES_DSN`` (default
``postgresql://postgres@127.0.0.1:5432/test``). Everything else runs on loopback with
private servers, and nothing is left running.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis.asyncio as aioredis
import yaml
from redis.exceptions import RedisError

from hotseat.launcher import (
    LaunchError,
    Managed,
    free_port,
    start_nats,
    start_redis,
    start_service,
)
from hotseat_common.connections import open_nats
from hotseat_common.keys import Keys
from hotseat_common.messages import SWAP_ENDINGS
from hotseat_pool_controller.model import IN_FLIGHT
from hotseat_sim.timeline import read_timeline

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the test tree's database helper and ledger oracle

from tests.support.faketime import library as faketime_library  # noqa: E402
from tests.support.infra import fresh_postgres_database  # noqa: E402
from tests.support.oracle import Verdict, judge  # noqa: E402

PREFIX = "soak"
STREAM = "AUDIT_SOAK"
POOLS = {"gpu0": ("judge", "coder"), "gpu1": ("writer", "painter")}
FAST = {
    "HOTSEAT_TICK_INTERVAL": "0.1",
    "HOTSEAT_RECONCILE_INTERVAL": "0.5",
    "HOTSEAT_HEARTBEAT_TTL": "1.0",
    "HOTSEAT_SHUTDOWN_GRACE": "3",
    "HOTSEAT_LOG_LEVEL": "warning",
}


def fleet_config(ports: dict[str, int]) -> dict[str, Any]:
    backends: list[dict[str, Any]] = []
    pools: list[dict[str, Any]] = []
    rules: list[dict[str, Any]] = []
    for pool, members in POOLS.items():
        small, large = members
        for member in members:
            backends.append(
                {
                    "name": member,
                    "address": f"http://127.0.0.1:{ports[member]}",
                    "pool": {"name": pool, "member": member},
                }
            )
            rules.append(
                {"name": member, "match": {"models": [member]}, "route": {"backends": [member]}}
            )
        rules.append(
            {
                "name": f"{pool}-ifidle",
                "match": {"models": [f"{pool}-ifidle"]},
                "route": {"backends": [large, small], "poolActivation": "IfIdle"},
            }
        )
        pools.append(
            {
                "name": pool,
                "leaseTtl": "3s",
                "swapBudget": "15s",
                "maxWaiters": 200,
                "default": small,
                "driver": {"kind": "sim", "gpuMemoryGiB": 24},
                "members": [
                    {
                        "name": small,
                        "sim": {
                            "loadSeconds": 0.3,
                            "unloadSeconds": 0.1,
                            "memoryGiB": 8,
                            "tokensPerSecond": 60,
                            "slots": 8,
                        },
                    },
                    {
                        "name": large,
                        "sim": {
                            "loadSeconds": 0.8,
                            "unloadSeconds": 0.1,
                            "memoryGiB": 20,
                            "tokensPerSecond": 120,
                            "slots": 8,
                        },
                    },
                ],
            }
        )
    return {
        "router": {"name": "soak", "requestTimeout": "30s"},
        "backends": backends,
        "pools": pools,
        "rules": rules,
    }


@dataclass
class Part:
    """A Hotseat process the chaos loop may kill, and how to start it again."""

    name: str
    entry: str
    args: list[str]
    port: int
    env: dict[str, str]
    proc: Managed | None = None
    starts: int = 0

    def start(self, logs: Path) -> Managed:
        """Start on its port; if something else took the port meanwhile (other programs
        share this machine), on a new one (clients read ``url`` afresh every request)."""
        for _ in range(3):
            self.starts += 1
            try:
                self.proc = start_service(
                    f"{self.name}-{self.starts}",
                    self.entry,
                    self.args,
                    port=self.port,
                    log_dir=logs,
                    env=self.env,
                    timeout=60,
                )
            except LaunchError as exc:
                if "address already in use" not in str(exc):
                    raise
                self.port = free_port()
            else:
                return self.proc
        raise LaunchError(f"{self.name}: no free port")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


ROUTER_CLOCK_OFFSET = "-90s"
NEVER_ANSWERED = "never answered (client timeout)"
CLIENT_TIMEOUT_S = 40.0
"""Longer than any hold (swapBudget 15 s) plus a stream: an answer later than this is lost."""
REUSED_IDS = 5
"""Clients whose number is a multiple of 3 draw their request ids from this many."""


@dataclass
class Tally:
    statuses: Counter[str] = field(default_factory=Counter)
    answered: Counter[str] = field(default_factory=Counter)
    """Answers received per client request id (reused ids are answered many times)."""
    kills: Counter[str] = field(default_factory=Counter)
    crashes: Counter[str] = field(default_factory=Counter)
    """Parts found dead that the chaos loop had not killed."""
    last_killed: set[str] = field(default_factory=set)
    cut_streams: int = 0


async def one_request(  # noqa: PLR0911 - one return per way a request can end
    http: httpx.AsyncClient,
    routers: list[Part],
    router: Part,
    *,
    request_id: str,
    body: dict[str, Any],
    tally: Tally,
) -> str:
    """Send one request; a router that refuses the connection (killed) is skipped for the
    other one, as a load balancer would. The answer's status (503s with their code)."""
    others = [r for r in routers if r is not router]
    for target in [router, *others]:
        try:
            async with http.stream(
                "POST",
                f"{target.url}/v1/chat/completions",
                json=body,
                headers={"x-hotseat-request-id": request_id},
            ) as response:
                text = (await response.aread()).decode(errors="replace")
        except httpx.ConnectError:
            continue
        except httpx.TimeoutException:
            return NEVER_ANSWERED  # held or stalled past the client's patience: a bug
        except httpx.HTTPError as exc:
            return f"cut by a router kill ({type(exc).__name__})"
        tally.answered[request_id] += 1
        if response.status_code == 503:
            if "retry-after" not in response.headers:
                return "503-no-retry-after"
            return f"503 {response.json()['error']['code']}"
        if body["stream"] and response.status_code == 200 and "[DONE]" not in text:
            tally.cut_streams += 1
            return "200-cut"
        return str(response.status_code)
    return "no router reachable"


async def client_loop(n: int, routers: list[Part], stop: asyncio.Event, tally: Tally) -> None:
    rng = random.Random(n)
    models = [m for members in POOLS.values() for m in members]
    models += [f"{p}-ifidle" for p in POOLS]
    async with httpx.AsyncClient(timeout=httpx.Timeout(CLIENT_TIMEOUT_S)) as http:
        i = 0
        while not stop.is_set():
            i += 1
            request_id = f"soak-dup-{i % REUSED_IDS}" if n % 3 == 0 else f"soak-{n}-{i}"
            model = rng.choice(models)
            router = routers[rng.randrange(len(routers))]
            stream = rng.random() < 0.5
            body = {
                "model": model,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": rng.randint(1, 30),
                "stream": stream,
            }
            status = await one_request(
                http, routers, router, request_id=request_id, body=body, tally=tally
            )
            tally.statuses[status] += 1
            await asyncio.sleep(rng.random() * 0.2)


@dataclass
class Store:
    """The controllers' Redis, which the chaos loop kills and starts again empty."""

    workdir: Path
    port: int
    proc: Managed | None = None

    def start(self) -> Managed:
        self.proc = start_redis(self.workdir, port=self.port)
        return self.proc


async def chaos_loop(
    parts: list[Part],
    *,
    store: Store,
    sims: list[Managed],
    logs: Path,
    stop: asyncio.Event,
    tally: Tally,
    interval: float,
) -> None:
    rng = random.Random(99)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval * (0.5 + rng.random()))
        if stop.is_set():
            return
        for crashed in [p for p in parts if p.proc is not None and not p.proc.alive()]:
            # Died without being killed: a bug. Restart it (as an orchestrator would).
            tally.crashes[crashed.name] += 1
            await asyncio.to_thread(crashed.start, logs)
        fault = rng.random()
        if fault < 0.6:
            part = rng.choice(parts)
            if part.proc is not None:
                part.proc.kill()
            tally.kills[part.name] += 1
            tally.last_killed = {part.name}
            await asyncio.sleep(0.5 + rng.random())
            await asyncio.to_thread(part.start, logs)
            tally.last_killed = set()
        elif fault < 0.8:
            if store.proc is not None:
                store.proc.kill()  # nothing on disk: it comes back empty
            tally.kills["redis (restarted empty)"] += 1
            await asyncio.sleep(0.2 + rng.random() * 0.3)
            await asyncio.to_thread(store.start)
        else:
            sim = rng.choice(sims)
            tally.kills["backend stalled (SIGSTOP)"] += 1
            os.kill(sim.pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(1 + rng.random() * 2)
            finally:
                os.kill(sim.pid, signal.SIGCONT)


async def stream_messages(nats_url: str) -> int:
    nc = await open_nats(nats_url, connect_timeout=5)
    try:
        info = await nc.jetstream().stream_info(STREAM)
        return int(info.state.messages)
    finally:
        await nc.close()


def stored(dsn: str) -> tuple[int, int, Counter[str], int]:
    """(rows, distinct ids, rows by outcome, dead letters) in the audit store."""
    with psycopg.connect(dsn) as conn:
        rows, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT id) FROM audit_events"
        ).fetchone() or (0, 0)
        by_outcome = Counter(
            {o: int(c) for o, c in conn.execute(
                "SELECT outcome, count(*) FROM audit_events GROUP BY outcome"
            ).fetchall()}
        )  # fmt: skip
        dead = (conn.execute("SELECT count(*) FROM audit_dead_letters").fetchone() or (0,))[0]
    return int(rows), int(distinct), by_outcome, int(dead)


SWAP_ENDS = sorted(outcome.value for outcome in SWAP_ENDINGS)


@dataclass
class SwapBooks:
    """The swaps' audit events in the store, set against what the fleet did."""

    without_start: int
    """Swaps whose end is stored but not their ``swap_started``: the controller that
    started them was killed with that event still in its publisher's buffer (never
    acknowledged by JetStream), and another controller took the swap over and ended it."""
    without_end: set[str]
    """Swaps whose ``swap_started`` is stored but none of ``SWAP_ENDS``."""
    twice_ended: int
    """Swaps with two ends or more stored (each end a distinct event)."""
    ends_without_id: int
    """Ends stored without a ``swap_id``: ``swap_cancelled`` of a drain whose demand left
    before its swap began (``demand_gone_while_draining``), with no ``swap_started``."""


def swap_books(dsn: str) -> SwapBooks:
    """The swaps' audit events, read in one connection."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(DISTINCT swap_id) FROM audit_events e"
            " WHERE kind = 'pool' AND swap_id IS NOT NULL AND outcome = ANY(%s)"
            " AND NOT EXISTS (SELECT 1 FROM audit_events s"
            "  WHERE s.swap_id = e.swap_id AND s.outcome = 'swap_started')",
            (SWAP_ENDS,),
        ).fetchone()
        unended = conn.execute(
            "SELECT DISTINCT swap_id FROM audit_events s"
            " WHERE kind = 'pool' AND outcome = 'swap_started' AND swap_id IS NOT NULL"
            " AND NOT EXISTS (SELECT 1 FROM audit_events e WHERE e.swap_id = s.swap_id"
            "  AND e.outcome = ANY(%s))",
            (SWAP_ENDS,),
        ).fetchall()
        twice = conn.execute(
            "SELECT count(*) FROM (SELECT swap_id FROM audit_events"
            " WHERE kind = 'pool' AND swap_id IS NOT NULL AND outcome = ANY(%s)"
            # A capacity pool's plan may fail one member alone before its own end; these
            # pools have one resident, so a swap has one end.
            " GROUP BY swap_id HAVING count(*) > 1) twice",
            (SWAP_ENDS,),
        ).fetchone()
        anonymous = conn.execute(
            "SELECT count(*) FROM audit_events"
            " WHERE kind = 'pool' AND swap_id IS NULL AND outcome = ANY(%s)",
            (SWAP_ENDS,),
        ).fetchone()
    return SwapBooks(
        without_start=int(row[0]) if row else 0,
        without_end={str(r[0]) for r in unended},
        twice_ended=int(twice[0]) if twice else 0,
        ends_without_id=int(anonymous[0]) if anonymous else 0,
    )


def ends_sent(logs: Path) -> set[str]:
    """Swaps whose end a controller logged as sent (``pool_event``, at ``info``, logged as
    the event enters the publisher's buffer): one of them not in the store was lost with
    that buffer, the controller killed before JetStream acknowledged it."""
    sent: set[str] = set()
    for path in logs.glob("controller*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if '"pool_event"' not in line:
                continue
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("outcome") in SWAP_ENDS and record.get("swap_id"):
                    sent.add(str(record["swap_id"]))
    return sent


async def swaps_in_flight(store_url: str) -> set[str]:
    """The swaps the pool store holds in flight (read after the controllers stopped: their
    swaps were still running, nobody's to end)."""
    client = aioredis.from_url(store_url, decode_responses=True)
    try:
        states = [await client.hgetall(Keys(PREFIX).pool_state(pool)) for pool in POOLS]
    finally:
        await client.aclose()
    return {s["swap"] for s in states if s.get("phase") in IN_FLIGHT and s.get("swap")}


async def pools_quiet(store_url: str, timeout: float = 30) -> bool:
    """Wait until no pool has a swap in flight (or time runs out): the swaps the chaos left
    running end before the fleet stops."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, RedisError):
            if not await swaps_in_flight(store_url):
                return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.2)


def request_ids(dsn: str) -> Counter[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT request_id FROM audit_events WHERE kind = 'request'").fetchall()
    return Counter(str(r[0]) for r in rows)


async def verdicts(redis_url: str, sims: list[Managed]) -> dict[str, Verdict]:
    """The full verdict of each pool's ledger, with the ledger writes its sims counted as
    failed (a failed last write leaves no gap in the sequence for the verdict to see)."""
    failures: Counter[str] = Counter()
    async with httpx.AsyncClient(timeout=10) as http:
        for sim in sims:
            state = (await http.get(f"{sim.url}/control/state")).json()
            failures[str(state["pool"])] += int(state["ledger_write_failures"])
    client: aioredis.Redis = aioredis.from_url(redis_url, decode_responses=True)
    try:
        return {
            pool: replace(
                judge(await read_timeline(client, Keys(PREFIX), pool)),
                write_failures=failures[pool],
            )
            for pool in POOLS
        }
    finally:
        await client.aclose()


async def settle(dsn: str, nats_url: str, timeout: float = 60) -> tuple[int, int]:
    """Wait until the store holds every event the stream accepted (or time runs out)."""
    deadline = time.monotonic() + timeout
    while True:
        accepted = await stream_messages(nats_url)
        rows, _, _, dead = await asyncio.to_thread(stored, dsn)
        if rows + dead >= accepted or time.monotonic() > deadline:
            return accepted, rows + dead
        await asyncio.sleep(1)


async def run(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="hotseat-soak-"))
    logs = workdir / "logs"
    members = [m for ms in POOLS.values() for m in ms]
    ports = {m: free_port() for m in members}
    config_path = workdir / "hotseat.yaml"
    config_path.write_text(yaml.safe_dump(fleet_config(ports)))
    infra: list[Managed] = []
    parts: list[Part] = []
    sims: list[Managed] = []
    with fresh_postgres_database() as dsn:
        try:
            nats_proc = start_nats(workdir / "nats")
            redis_proc = start_redis(workdir / "ledger-redis")  # the sims' ledger: never killed
            store = Store(workdir / "store-redis", free_port())
            store.start()
            infra += [nats_proc, redis_proc]
            sim_env = {
                **FAST,
                "HOTSEAT_NATS_URL": nats_proc.url,
                "HOTSEAT_REDIS_URL": redis_proc.url,
                "HOTSEAT_KEY_PREFIX": PREFIX,
                "HOTSEAT_CONFIG": str(config_path),
            }
            env = {
                **FAST,
                "HOTSEAT_NATS_URL": nats_proc.url,
                "HOTSEAT_REDIS_URL": f"redis://127.0.0.1:{store.port}/0",
                "HOTSEAT_SUBJECT_PREFIX": PREFIX,
                "HOTSEAT_KEY_PREFIX": PREFIX,
                "HOTSEAT_AUDIT_STREAM": STREAM,
                "HOTSEAT_CONFIG": str(config_path),
            }
            sims += [
                start_service(
                    f"sim-{member}",
                    "hotseat-sim",
                    ["--backend", member],
                    port=ports[member],
                    log_dir=logs,
                    env=sim_env,
                    ready_path="/control/state",
                )
                for member in members
            ]
            skewed = _skewed_clock(env)
            routers = [
                Part(
                    f"router{i}",
                    "hotseat-router",
                    ["--instance", f"router{i}"],
                    free_port(),
                    skewed if i == 2 else env,
                )
                for i in (1, 2)
            ]
            controllers = [
                Part(
                    f"controller{i}",
                    "hotseat-controller",
                    ["--instance", f"c{i}"],
                    free_port(),
                    # Each audit event it sends is logged (info): ends_sent reads them.
                    {**env, "HOTSEAT_LOG_LEVEL": "info"},
                )
                for i in (1, 2)
            ]
            audit = Part("audit", "hotseat-audit", ["--dsn", dsn], free_port(), env)
            parts = [*routers, *controllers, audit]
            for part in parts:
                part.start(logs)
            print(f"soak: fleet up in {workdir}; {args.duration:.0f}s of traffic and chaos")
            tally = Tally()
            stop = asyncio.Event()
            started = time.monotonic()
            clients = [
                asyncio.create_task(client_loop(n, routers, stop, tally))
                for n in range(args.clients)
            ]
            chaos = asyncio.create_task(
                chaos_loop(
                    parts,
                    store=store,
                    sims=sims,
                    logs=logs,
                    stop=stop,
                    tally=tally,
                    interval=args.chaos_interval,
                )
            )
            await asyncio.sleep(args.duration)
            stop.set()
            await chaos
            await asyncio.gather(*clients)
            elapsed = time.monotonic() - started
            for part in parts:  # every part up again before the books are closed
                if part.proc is None or not part.proc.alive():
                    if part.name not in tally.last_killed:
                        tally.crashes[part.name] += 1
                    await asyncio.to_thread(part.start, logs)
            store_url = f"redis://127.0.0.1:{store.port}/0"
            quiet = await pools_quiet(store_url)
            for part in [*routers, *controllers]:  # graceful: buffered events are flushed
                if part.proc is not None:
                    await asyncio.to_thread(part.proc.stop, 10)
            in_flight = await swaps_in_flight(store_url)
            accepted, landed = await settle(dsn, nats_proc.url)
            rows, distinct, by_outcome, dead = await asyncio.to_thread(stored, dsn)
            ids = await asyncio.to_thread(request_ids, dsn)
            books = await asyncio.to_thread(swap_books, dsn)
            sent = await asyncio.to_thread(ends_sent, logs)
            ledger = await verdicts(redis_proc.url, sims)
        finally:
            for sim in sims:  # a sim left stopped by an interrupted run
                with contextlib.suppress(ProcessLookupError):
                    os.kill(sim.pid, signal.SIGCONT)
            stores = [store.proc] if store.proc is not None else []
            for proc in [*(p.proc for p in parts if p.proc is not None), *sims, *infra, *stores]:
                proc.stop(10)

    lost = max(0, accepted - landed)
    duplicates = rows - distinct
    violations = sum(v.violations for v in ledger.values())
    unaudited = sum(max(0, n - ids[rid]) for rid, n in tally.answered.items())
    doubled = sum(max(0, c - max(1, tally.answered[rid])) for rid, c in ids.items())
    swaps = {k: by_outcome[f"swap_{k}"] for k in ("completed", "started", "cancelled", "failed")}
    unended = books.without_end - in_flight
    end_lost = unended & sent  # sent, lost with a killed controller's buffer
    never_ended = sorted(unended - sent)
    report = {
        "duration": f"{elapsed:.0f} s, {args.clients} clients",
        "requests": f"{sum(tally.statuses.values())}: {_counts(tally.statuses)}",
        "faults": f"{sum(tally.kills.values())}: {_counts(tally.kills)}",
        "router2 clock": ROUTER_CLOCK_OFFSET
        if skewed is not env
        else "not skewed (no libfaketime)",
        "reused ids": f"{sum(n for rid, n in tally.answered.items() if '-dup-' in rid)} answers "
        f"on {REUSED_IDS} client request ids shared by clients on both routers",
        "crashes": f"{sum(tally.crashes.values())} {_counts(tally.crashes)}".strip(),
        "never answered": str(tally.statuses[NEVER_ANSWERED]),
        "swaps": f"{_counts(Counter(swaps))}; ended without a stored start"
        f" {books.without_start} (its start lost in a killed controller's buffer)",
        "swap ends": f"started without a stored end {len(books.without_end)}: in flight at the"
        f" stop {len(books.without_end & in_flight)}"
        f"{'' if quiet else ' (pools not quiet after 30 s)'}, end sent and lost in a killed"
        f" controller's buffer {len(end_lost)}, never ended {len(never_ended)}"
        f"{' ' + ', '.join(never_ended) if never_ended else ''}; ended twice"
        f" {books.twice_ended}; drains cancelled before a swap began {books.ends_without_id}",
        "busy skips": str(by_outcome["busy_skip"]),
        "leases expired": str(by_outcome["lease_expired"]),
        "audit": f"accepted by JetStream {accepted}, stored {landed} ({rows} events + "
        f"{dead} dead letters), lost {lost}, duplicates {duplicates}",
        "request events": f"answered without one {unaudited} (lost in a killed router's "
        f"buffer), with two or more {doubled}",
        **{f"ledger {pool}": str(v.summary()) for pool, v in ledger.items()},
        "violations": str(violations),
    }
    for label, text in report.items():
        print(f"{label:<16}{text}")
    crashes = sum(tally.crashes.values())
    failed = violations > 0 or lost > 0 or duplicates > 0 or doubled > 0 or crashes > 0
    if never_ended or books.twice_ended:
        print(f"{len(never_ended)} swaps never ended, {books.twice_ended} ended twice (audit)")
        failed = True
    bad_status = (
        tally.statuses["503-no-retry-after"] + tally.cut_streams + tally.statuses[NEVER_ANSWERED]
    )
    if bad_status:
        print(
            f"{bad_status} answers broke the contract (503 without Retry-After, cut stream, "
            "never answered)"
        )
        failed = True
    print("FAIL" if failed else "OK")
    return 1 if failed else 0


def _skewed_clock(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the wall clock ``ROUTER_CLOCK_OFFSET`` away (``env`` itself without
    libfaketime)."""
    lib = faketime_library()
    if lib is None:
        print("soak: libfaketime not installed (scripts/system_deps.sh): no skewed router")
        return env
    return {**env, "LD_PRELOAD": str(lib), "FAKETIME": ROUTER_CLOCK_OFFSET,
            "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_NO_CACHE": "1"}  # fmt: skip


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counter.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=150.0, help="seconds of traffic")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument(
        "--chaos-interval", type=float, default=6.0, help="mean seconds between kills"
    )
    parser.add_argument("--ci", action="store_true", help="a one-minute run (for CI)")
    args = parser.parse_args()
    if args.ci:
        args.duration = min(args.duration, 60.0)
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
