"""One query answers a swap's story, on both stores: ``GET /v1/swaps/{id}`` (and ``hotseat
audit swap ID``) returns its cause, its waiters and its phase times from the events that
carry its id; migration 3 adds the columns to a store that already holds events."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
from datetime import timedelta
from pathlib import Path

import httpx
import orjson
import psycopg

from hotseat.launcher import find_binary
from hotseat_audit.decoding import Incoming
from hotseat_audit.query import EventFilter
from hotseat_audit.store import open_store, parse_dsn
from hotseat_audit.store.migrations import LATEST, MIGRATIONS
from hotseat_common.audit_stream import AuditStreamSpec, ensure_audit_stream
from hotseat_common.connections import open_nats
from hotseat_common.messages.audit import AuditEvent, PoolOutcome, RequestOutcome
from hotseat_common.subjects import AUDIT_DURABLE, Subjects
from tests.audit.conftest import AuditFactory, stream_name
from tests.audit.support import T0, pool_event, publish_events, request_events
from tests.support.audit_trail import wait_consumed

SWAP = "gpu0-1764768000123"
OTHER = "gpu0-1764768009999"
TURNED = "gpu0-1764768020000"


def _request(
    request_id: str, outcome: RequestOutcome, seconds: float, swap_id: str | None, **fields: object
) -> AuditEvent:
    about = {"router": "r1", "rule": "code", "pool": "gpu0", "member": "coder", "backend": "coder"}
    return AuditEvent.model_validate(
        {
            "kind": "request",
            "outcome": outcome.value,
            "time": T0 + timedelta(seconds=seconds),
            "request_id": request_id,
            "duration_ms": seconds * 1000,
            "swap_id": swap_id,
            **about,
            **fields,
        }
    )


def swap_story() -> list[AuditEvent]:
    """One swap judge -> coder caused by ``req-cause`` and waited for by two more (one
    timed out); another swap with its own waiter; a third, still in flight, that turned
    from coder to small before its load; requests of no swap."""
    at = T0 + timedelta(seconds=1)
    common = {"controller": "c1", "pool": "gpu0", "from_member": "judge", "to_member": "coder"}
    return [
        pool_event(
            PoolOutcome.SWAP_STARTED,
            at,
            member="coder",
            epoch=1764768000123,
            reason="demand",
            request_id="req-cause",
            swap_id=SWAP,
            **common,
        ),
        pool_event(
            PoolOutcome.SWAP_COMPLETED,
            at + timedelta(seconds=5),
            member="coder",
            epoch=1764768000123,
            swap_id=SWAP,
            unload_ms=2000.0,
            load_ms=3000.0,
            **common,
        ),
        _request("req-cause", RequestOutcome.SERVED, 7, SWAP, status=200),
        _request("req-waiter", RequestOutcome.SERVED, 8, SWAP, status=200),
        _request("req-late", RequestOutcome.POOL_ACTIVATION_TIMEOUT, 4, SWAP, status=503),
        pool_event(
            PoolOutcome.SWAP_STARTED,
            at + timedelta(seconds=60),
            member="judge",
            reason="swap_back",
            swap_id=OTHER,
            controller="c1",
            pool="gpu0",
        ),
        _request("req-other", RequestOutcome.SERVED, 70, OTHER, status=200),
        pool_event(
            PoolOutcome.SWAP_STARTED,
            at + timedelta(seconds=80),
            reason="demand",
            swap_id=TURNED,
            **common,
        ),
        pool_event(
            PoolOutcome.SWAP_RETARGETED,
            at + timedelta(seconds=81),
            reason="more_urgent",
            swap_id=TURNED,
            **{**common, "from_member": "coder", "to_member": "small"},
        ),
        *request_events(3, start=T0 + timedelta(seconds=2)),
    ]


async def _serve(start_audit: AuditFactory, dsn: str, nats_url: str, prefix: str) -> str:
    """An audit service over ``dsn`` holding :func:`swap_story`; its URL."""
    service = start_audit(dsn)
    nc = await open_nats(nats_url)
    try:
        js = nc.jetstream()
        subjects = Subjects(prefix)
        await ensure_audit_stream(js, AuditStreamSpec(name=stream_name(prefix), subjects=subjects))
        acks = await publish_events(js, subjects, swap_story())
        await wait_consumed(js, stream_name(prefix), AUDIT_DURABLE, acks[-1].seq)
    finally:
        await nc.drain()
    return service.url


async def test_one_query_tells_a_swaps_cause_waiters_and_phases(
    start_audit: AuditFactory, store_dsn: str, nats_server: object, prefix: str
) -> None:
    """``GET /v1/swaps/{id}``: the reason and the request that started the swap (with its
    own event), every request that waited for it (oldest first, the cause marked, the one
    that timed out included), the unloading, loading and whole times; nothing of the
    other swap or of requests that waited for none."""
    url = await _serve(start_audit, store_dsn, nats_server.url, prefix)  # type: ignore[attr-defined]
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        report = (await client.get(f"/v1/swaps/{SWAP}")).json()
        missing = await client.get("/v1/swaps/gpu0-1")
        by_filter = (await client.get("/v1/events", params={"swap_id": OTHER})).json()
        turned = (await client.get(f"/v1/swaps/{TURNED}")).json()
    assert (report["swap_id"], report["pool"], report["outcome"]) == (
        SWAP,
        "gpu0",
        "swap_completed",
    )
    assert (report["from_member"], report["to_member"]) == ("judge", "coder")
    assert report["cause"]["reason"] == "demand"
    assert report["cause"]["request_id"] == "req-cause"
    assert report["cause"]["request"]["outcome"] == "served"
    assert report["phases"] == {"unload_ms": 2000.0, "load_ms": 3000.0, "total_ms": 5000.0}
    waiters = [(w["request_id"], w["outcome"], w["caused"]) for w in report["waiters"]]
    assert waiters == [
        ("req-late", "pool_activation_timeout", False),
        ("req-cause", "served", True),
        ("req-waiter", "served", False),
    ]
    assert [e["outcome"] for e in report["events"]] == ["swap_started", "swap_completed"]
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "swap_not_found"
    assert [e["request_id"] for e in by_filter["events"] if e["kind"] == "request"] == ["req-other"]
    # Retargeted before its load: the report names the member it loads now.
    assert (turned["from_member"], turned["to_member"], turned["outcome"]) == (
        "judge",
        "small",
        "in_flight",
    )
    assert [e["outcome"] for e in turned["events"]] == ["swap_started", "swap_retargeted"]


async def test_hotseat_audit_swap_prints_the_story(
    start_audit: AuditFactory, store_dsn: str, nats_server: object, prefix: str
) -> None:
    """``hotseat audit swap ID`` prints the cause, the phase times and a row per waiter;
    ``--json`` prints the API's report; an unknown id exits 1 with the API's error."""
    url = await _serve(start_audit, store_dsn, nats_server.url, prefix)  # type: ignore[attr-defined]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [find_binary("hotseat"), "audit", "swap", *args, "--url", url]
        return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)

    table, as_json, unknown = await asyncio.gather(
        asyncio.to_thread(run, SWAP),
        asyncio.to_thread(run, SWAP, "--json"),
        asyncio.to_thread(run, "gpu0-1"),
    )
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "swap", SWAP, "pool", "gpu0", "judge", "->", "coder", "swap_completed"
    ]  # fmt: skip
    assert lines[1] == "cause: demand, request req-cause (served, 7000 ms)"
    assert lines[2] == "phases: unloading 2000 ms, loading 3000 ms, total 5000 ms"
    assert lines[3] == "waiters: 3"
    rows = [line.split() for line in lines[5:]]
    assert [(r[2], r[3]) for r in rows] == [
        ("req-late", "pool_activation_timeout"),
        ("req-cause", "served"),
        ("req-waiter", "served"),
    ]
    assert rows[1][-1] == "cause"
    assert as_json.returncode == 0, as_json.stderr
    assert orjson.loads(as_json.stdout)["cause"]["request_id"] == "req-cause"
    assert unknown.returncode == 1
    assert "swap_not_found" in unknown.stderr


async def test_migration_3_keeps_older_events(store_dsn: str) -> None:
    """A store at schema 2 holding events migrates to the latest: the old rows read back
    unchanged (no swap id), and new events store and filter by their swap id."""
    target = parse_dsn(store_dsn)
    sqlite = target.kind == "sqlite"
    old = request_events(2)
    when = 1 if sqlite else T0
    insert = "INSERT INTO audit_events (id, time, kind, outcome, request_id, v, stored_at) " + (
        "VALUES (?, ?, 'request', 'served', ?, 1, ?)"
        if sqlite
        else "VALUES (%s, %s, 'request', 'served', %s, 1, %s)"
    )
    statements: list[tuple[str, tuple[object, ...]]] = [
        (sql, ())
        for sql in [  # the store as version 2 left it, with two events in it
            *(sql for m in MIGRATIONS[:2] for sql in (m.sqlite if sqlite else m.postgres)),
            "CREATE TABLE schema_version (version integer PRIMARY KEY, name text NOT NULL, "
            + ("applied_at integer NOT NULL)" if sqlite else "applied_at timestamptz)"),
            "INSERT INTO schema_version (version, name, applied_at) VALUES "  # noqa: S608 - fixed text
            + ("(1, 'a', 0), (2, 'b', 0)" if sqlite else "(1, 'a', now()), (2, 'b', now())"),
        ]
    ]
    statements += [(insert, (e.id, when, e.request_id, when)) for e in old]
    await asyncio.to_thread(_execute, store_dsn, statements)
    store = await open_store(target)
    try:
        assert await store.migrate() == LATEST
        new = swap_story()[:3]
        await store.write([Incoming(e, i + 1) for i, e in enumerate(new)], [])
        found = await store.events(EventFilter(swap_id=(SWAP,)), limit=10)
        everything = await store.events(EventFilter(), limit=10)
    finally:
        await store.close()
    assert {e.id for e in found} == {e.id for e in new}
    completed = next(e for e in found if e.outcome == "swap_completed")
    assert (completed.unload_ms, completed.load_ms) == (2000.0, 3000.0)
    older = {e.id: e for e in everything if e.id in {o.id for o in old}}
    assert len(older) == 2
    assert all(e.swap_id is None and e.request_id is not None for e in older.values())


def _execute(dsn: str, statements: list[tuple[str, tuple[object, ...]]]) -> None:
    """Run ``statements`` in one transaction with a plain driver, not the store code."""
    target = parse_dsn(dsn)
    if target.kind == "sqlite":
        Path(target.location).parent.mkdir(parents=True, exist_ok=True)
        with sqlite3.connect(target.location) as conn:
            for sql, params in statements:
                conn.execute(sql, params)
        return
    with psycopg.connect(target.location) as pg:
        for sql, params in statements:
            pg.execute(sql, params)  # type: ignore[arg-type]
