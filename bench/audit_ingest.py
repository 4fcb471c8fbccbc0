"""Audit benchmark: sustained ingest rate from JetStream into SQLite and PostgreSQL, and
filtered query latency with 1,000,000 stored events.

Ingest: ``--events`` events are published to a private nats-server while the audit
service is stopped; then ``hotseat-audit`` starts and drains the backlog through the
durable consumer (fetch, decode, commit one transaction per batch, ack). The rate is the
events acknowledged (every one committed first) per second of wall time, measured from
the consumer's ack floor between the first and the last acknowledgement.

Query: ``--rows`` rows are bulk-loaded straight into a migrated store (COPY for
PostgreSQL, batched inserts for SQLite), then each filtered query of the API is timed
``--iterations`` times through the store (the code the API runs) and through the HTTP
API of a running service (``limit=100``, the API's default page).

    .venv/bin/python bench/audit_ingest.py [--events 50000] [--rows 1000000]

This is a measurement, not a test: the figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg

from hotseat.launcher import Managed, free_port, start_nats, start_service
from hotseat_audit.query import Cursor, EventFilter, to_micros
from hotseat_audit.store import AuditStore, open_store, parse_dsn
from hotseat_audit.store.base import STORED_FIELDS
from hotseat_common.audit_stream import AuditStreamSpec, ensure_audit_stream
from hotseat_common.connections import open_nats
from hotseat_common.messages.audit import AuditEvent, PoolOutcome, RequestOutcome
from hotseat_common.subjects import AUDIT_DURABLE, Subjects

DEFAULT_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/test"
PREFIX = "bench"
STREAM = "BENCH_AUDIT"
NOW = datetime.now(UTC).replace(microsecond=0)
SPAN = timedelta(days=30)

# A plausible mix: mostly served requests, a few failures and pool transitions.
OUTCOMES = (
    [("request", RequestOutcome.SERVED.value)] * 85
    + [("request", o.value) for o in (
        RequestOutcome.POOL_INCUMBENT_BUSY, RequestOutcome.POOL_ACTIVATION_TIMEOUT,
        RequestOutcome.ALL_BACKENDS_FAILED, RequestOutcome.NO_ROUTE, RequestOutcome.REJECTED,
        RequestOutcome.CLIENT_DISCONNECTED,
    )]
    + [("pool", o.value) for o in (
        PoolOutcome.BUSY_SKIP, PoolOutcome.BUSY_SKIP, PoolOutcome.SWAP_STARTED,
        PoolOutcome.SWAP_COMPLETED, PoolOutcome.SWAP_FAILED, PoolOutcome.LEASE_EXPIRED,
    )]
)  # fmt: skip
POOLS = [(f"gpu{p}", m) for p in range(4) for m in ("assistant", "coder", "embed")]
ROUTERS = ["r1", "r2", "r3"]
RULES = [f"rule-{i}" for i in range(10)]


# ---------------------------------------------------------------- helpers


@contextmanager
def postgres_database(admin: str) -> Iterator[str]:
    name = f"hotseat_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin.rpartition("/")[0] + "/" + name
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def row_values(i: int, rng: random.Random) -> dict[str, Any]:
    kind, outcome = rng.choice(OUTCOMES)
    pool, member = rng.choice(POOLS)
    when = NOW - SPAN + timedelta(microseconds=int(SPAN / timedelta(microseconds=1) * i / ROWS))
    values: dict[str, Any] = {
        "id": uuid.UUID(int=rng.getrandbits(128)).hex,
        "time": when,
        "kind": kind,
        "outcome": outcome,
        "request_id": f"req-{i}",
        "router": rng.choice(ROUTERS),
        "controller": None,
        "rule": rng.choice(RULES) if kind == "request" else None,
        "pool": pool,
        "member": member,
        "backend": member if kind == "request" else None,
        "status": 200 if outcome == "served" else (503 if kind == "request" else None),
        "duration_ms": round(rng.uniform(5, 3000), 1) if kind == "request" else None,
        "from_member": None,
        "to_member": member if outcome.startswith("swap") else None,
        "epoch": i if kind == "pool" else None,
        "reason": None,
        "v": 1,
        "stream_seq": i + 1,
    }
    return values


ROWS = 1_000_000


# ---------------------------------------------------------------- ingest


async def publish_backlog(nats_url: str, n: int) -> tuple[float, int]:
    nc = await open_nats(nats_url)
    js = nc.jetstream(publish_async_max_pending=8000)
    subjects = Subjects(PREFIX)
    await ensure_audit_stream(js, AuditStreamSpec(name=STREAM, subjects=subjects))
    rng = random.Random(1)
    started = time.perf_counter()
    futures = []
    for i in range(n):
        kind, outcome = rng.choice(OUTCOMES)
        pool, member = rng.choice(POOLS)
        event = AuditEvent(
            kind=kind, outcome=outcome, request_id=f"req-{i}", router=rng.choice(ROUTERS),
            rule=rng.choice(RULES), pool=pool, member=member, backend=member, status=200,
            duration_ms=12.5,
        )  # fmt: skip
        futures.append(
            await js.publish_async(
                subjects.audit(kind, outcome), event.to_bytes(), headers={"Nats-Msg-Id": event.id}
            )
        )
    acks = await asyncio.gather(*futures)
    elapsed = time.perf_counter() - started
    await nc.close()
    return n / elapsed, acks[-1].seq


async def ack_floor(js: Any) -> int:
    try:
        info = await js.consumer_info(STREAM, AUDIT_DURABLE, timeout=5)
    except Exception:  # not created yet
        return 0
    return int(info.ack_floor.stream_seq or 0) if info.ack_floor else 0


async def measure_ingest(workdir: Path, dsn: str, n: int, batch: int) -> tuple[float, float]:
    nats_proc = start_nats(workdir / "nats")
    audit: Managed | None = None
    try:
        publish_rate, last = await publish_backlog(nats_proc.url, n)
        nc = await open_nats(nats_proc.url)
        js = nc.jetstream()
        audit = start_service(
            "audit", "hotseat-audit",
            ["--nats-url", nats_proc.url, "--subject-prefix", PREFIX, "--audit-stream", STREAM,
             "--dsn", dsn, "--batch-size", str(batch), "--log-level", "warning"],
            port=free_port(), log_dir=workdir,
        )  # fmt: skip
        first_seen, first_floor = None, 0
        while True:
            floor = await ack_floor(js)
            now = time.perf_counter()
            if first_seen is None and floor > 0:
                first_seen, first_floor = now, floor
            if floor >= last:
                break
            await asyncio.sleep(0.02)
        await nc.close()
        if first_seen is None:
            raise SystemExit("nothing was ingested")
        rate = (last - first_floor) / (now - first_seen)
        return publish_rate, rate
    finally:
        if audit is not None:
            audit.stop()
        nats_proc.stop()


# ---------------------------------------------------------------- bulk load


def load_sqlite(path: Path, rows: int) -> None:
    rng = random.Random(7)
    columns = [*STORED_FIELDS, "stored_at"]
    marks = ", ".join("?" * len(columns))
    sql = f"INSERT INTO audit_events ({', '.join(columns)}) VALUES ({marks})"  # noqa: S608
    stored_at = to_micros(NOW)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA synchronous=OFF")
        chunk: list[tuple[Any, ...]] = []
        for i in range(rows):
            values = row_values(i, rng)
            values["time"] = to_micros(values["time"])
            chunk.append((*values.values(), stored_at))
            if len(chunk) == 50_000:
                conn.executemany(sql, chunk)
                conn.commit()
                chunk.clear()
        conn.executemany(sql, chunk)
        conn.commit()
        conn.execute("ANALYZE")


def load_postgres(dsn: str, rows: int) -> None:
    rng = random.Random(7)
    with psycopg.connect(dsn) as conn:
        with (
            conn.cursor() as cur,
            cur.copy(f"COPY audit_events ({', '.join(STORED_FIELDS)}) FROM STDIN") as copy,
        ):
            for i in range(rows):
                copy.write_row(tuple(row_values(i, rng).values()))
        conn.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE audit_events")


# ---------------------------------------------------------------- queries


@dataclass
class Probe:
    name: str
    params: dict[str, Any]


def probes() -> list[Probe]:
    hour_ago = NOW - timedelta(hours=1)
    return [
        Probe("newest, no filter", {}),
        Probe("outcome=pool_incumbent_busy", {"outcome": "pool_incumbent_busy"}),
        Probe("pool=gpu1 member=coder", {"pool": "gpu1", "member": "coder"}),
        Probe("router=r2 rule=rule-3", {"router": "r2", "rule": "rule-3"}),
        Probe("outcome=swap_failed pool=gpu2", {"outcome": "swap_failed", "pool": "gpu2"}),
        Probe("request_id=<one>", {"request_id": f"req-{ROWS // 2 + 1}"}),
        Probe(
            "kind=request, last hour",
            {"kind": "request", "since": hour_ago.isoformat(), "until": NOW.isoformat()},
        ),
        Probe("outcome=served, page 2", {"outcome": "served", "page": 2}),
    ]


def to_filter(params: dict[str, Any]) -> EventFilter:
    values = {k: (v,) for k, v in params.items() if k not in {"since", "until", "page"}}
    since = datetime.fromisoformat(params["since"]) if "since" in params else None
    until = datetime.fromisoformat(params["until"]) if "until" in params else None
    return EventFilter(**values, since=since, until=until)


async def timed(fn: Callable[[], Awaitable[Any]], iterations: int) -> list[float]:
    await fn()  # warm the cache and the plan once
    samples = []
    for _ in range(iterations):
        started = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def measure_queries(
    store: AuditStore, url: str, iterations: int
) -> list[tuple[str, list[float], list[float]]]:
    results = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        for probe in probes():
            filters = to_filter(probe.params)
            after = None
            http_params = {k: v for k, v in probe.params.items() if k != "page"}
            if probe.params.get("page") == 2:
                first = await store.events(filters, limit=100)
                after = Cursor(first[-1].time, first[-1].id)
                body = (await client.get("/v1/events", params=http_params)).json()
                http_params["cursor"] = body["next"]

            async def via_store(f: EventFilter = filters, a: Cursor | None = after) -> Any:
                return await store.events(f, limit=101, after=a)

            async def via_http(p: dict[str, Any] = http_params) -> Any:
                response = await client.get("/v1/events", params=p)
                response.raise_for_status()
                return response

            found = len(await via_store())
            if not found:
                raise SystemExit(f"{probe.name}: matched nothing; the data set is wrong")
            results.append(
                (probe.name, await timed(via_store, iterations), await timed(via_http, iterations))
            )
    return results


async def query_benchmark(kind: str, workdir: Path, dsn: str, rows: int, iterations: int) -> None:
    store = await open_store(parse_dsn(dsn))
    await store.migrate()
    started = time.perf_counter()
    if kind == "sqlite":
        await asyncio.to_thread(load_sqlite, Path(parse_dsn(dsn).location), rows)
    else:
        await asyncio.to_thread(load_postgres, dsn, rows)
    print(f"  bulk-loaded {rows:,} rows in {time.perf_counter() - started:.0f}s")
    nats_proc = start_nats(workdir / "nats-q")
    audit = start_service(
        "audit-q", "hotseat-audit",
        ["--nats-url", nats_proc.url, "--subject-prefix", PREFIX, "--audit-stream", STREAM,
         "--dsn", dsn, "--log-level", "warning", "--retention", "0"],
        port=free_port(), log_dir=workdir,
    )  # fmt: skip
    try:
        results = await measure_queries(store, audit.url, iterations)
    finally:
        audit.stop()
        nats_proc.stop()
        await store.close()
    print(f"  {'query (limit 100)':34} {'store p50':>9} {'p99':>7}   {'HTTP p50':>8} {'p99':>7}")
    everything_store: list[float] = []
    everything_http: list[float] = []
    for name, store_ms, http_ms in results:
        everything_store += store_ms
        everything_http += http_ms
        print(
            f"  {name:34} {statistics.median(store_ms):7.2f}ms {percentile(store_ms, 0.99):5.2f}ms"
            f"   {statistics.median(http_ms):6.2f}ms {percentile(http_ms, 0.99):5.2f}ms"
        )
    print(
        f"  {'all filtered queries':34} {statistics.median(everything_store):7.2f}ms "
        f"{percentile(everything_store, 0.99):5.2f}ms   "
        f"{statistics.median(everything_http):6.2f}ms {percentile(everything_http, 0.99):5.2f}ms"
    )


# ---------------------------------------------------------------- main


async def run(args: argparse.Namespace) -> None:
    global ROWS  # noqa: PLW0603 - the time spread of generated rows follows --rows
    ROWS = args.rows
    admin = args.postgres_dsn
    print(f"hotseat audit benchmark ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")
    for kind in args.stores.split(","):
        with tempfile.TemporaryDirectory(prefix=f"hotseat-bench-{kind}-") as tmp:
            workdir = Path(tmp)
            with contextmanager_for(kind, workdir, admin)() as dsn:
                if not args.skip_ingest:
                    publish_rate, rate = await measure_ingest(
                        workdir / "ingest", dsn, args.events, args.batch_size
                    )
                    print(
                        f"{kind}: ingest {rate:,.0f} events/s ({args.events:,} events, batch "
                        f"{args.batch_size}; published at {publish_rate:,.0f}/s beforehand)"
                    )
            with contextmanager_for(kind, workdir / "q", admin)() as dsn:
                if not args.skip_query:
                    print(f"{kind}: query latency at {args.rows:,} stored events")
                    await query_benchmark(kind, workdir, dsn, args.rows, args.iterations)


def contextmanager_for(kind: str, workdir: Path, admin: str) -> Callable[[], Any]:
    @contextmanager
    def sqlite_dsn() -> Iterator[str]:
        workdir.mkdir(parents=True, exist_ok=True)
        yield f"sqlite:///{workdir / 'audit.db'}"

    if kind == "sqlite":
        return sqlite_dsn
    return lambda: postgres_database(admin)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=50_000, help="events to ingest")
    parser.add_argument("--batch-size", type=int, default=500, help="the service's batch size")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows for the query part")
    parser.add_argument("--iterations", type=int, default=200, help="runs of each query")
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument(
        "--postgres-dsn",
        default=os.environ.get("HOTSEAT_TEST_POSTGRES_DSN", DEFAULT_ADMIN_DSN),
        help="an admin DSN; a fresh database is created and dropped",
    )
    parser.add_argument("--skip-ingest", action="store_true")
    parser.add_argument("--skip-query", action="store_true")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
