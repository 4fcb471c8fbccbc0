"""Helpers for audit tests: building events, publishing them fast, reading stores raw."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import psycopg
from nats.js import JetStreamContext
from nats.js.api import PubAck

from hotseat_audit.decoding import Incoming
from hotseat_audit.store import open_store, parse_dsn
from hotseat_common.messages.audit import AuditEvent, PoolOutcome, RequestOutcome
from hotseat_common.subjects import Subjects

T0 = (datetime.now(UTC) - timedelta(days=3)).replace(hour=0, minute=0, second=0, microsecond=0)
"""Test events start at midnight three days ago: relative to now, so the data never
drifts into (or out of) a window that is relative to now, such as the API's default last
24 hours or a retention age, whatever the date the suite runs on."""
HISTORY_ROWS = 10_000
"""Rows already in a store that is "in production" (:func:`fill_history`)."""


def request_events(
    n: int, *, start: datetime = T0, step: timedelta = timedelta(seconds=1)
) -> list[AuditEvent]:
    """``n`` served request events one ``step`` apart."""
    return [
        AuditEvent(
            kind="request",
            outcome=RequestOutcome.SERVED,
            time=start + i * step,
            request_id=f"req-{i}",
            router="r1",
            rule="default",
            pool="gpu0",
            member="assistant",
            backend="assistant",
            status=200,
            duration_ms=12.5,
        )
        for i in range(n)
    ]


def pool_event(outcome: PoolOutcome, when: datetime, **fields: object) -> AuditEvent:
    return AuditEvent.model_validate(
        {"kind": "pool", "outcome": outcome.value, "time": when, **fields}
    )


async def publish_events(
    js: JetStreamContext, subjects: Subjects, events: Iterable[AuditEvent]
) -> list[PubAck]:
    """Publish with ``Nats-Msg-Id`` = event id and concurrent publish acks; all must be acked."""
    futures = [
        await js.publish_async(
            subjects.audit(e.kind, e.outcome), e.to_bytes(), headers={"Nats-Msg-Id": e.id}
        )
        for e in events
    ]
    return list(await asyncio.wait_for(asyncio.gather(*futures), timeout=60))


async def publish_raw(
    js: JetStreamContext, subject: str, payloads: Sequence[bytes]
) -> list[PubAck]:
    return [await js.publish(subject, p, timeout=5) for p in payloads]


def _sql(dsn: str, query: str) -> list[tuple[object, ...]]:
    target = parse_dsn(dsn)
    if target.kind == "sqlite":
        with sqlite3.connect(target.location) as conn:
            return list(conn.execute(query).fetchall())
    with psycopg.connect(target.location) as conn:
        return list(conn.execute(query).fetchall())  # type: ignore[arg-type]


async def raw_rows(dsn: str, query: str) -> list[tuple[object, ...]]:
    """Run ``query`` on the store behind ``dsn`` with a plain driver, not the store code."""
    return await asyncio.to_thread(_sql, dsn, query)


async def counts(dsn: str) -> tuple[int, int]:
    """(rows, distinct ids) in the events table."""
    try:
        rows = await raw_rows(dsn, "SELECT count(*), count(DISTINCT id) FROM audit_events")
    except (sqlite3.OperationalError, psycopg.errors.UndefinedTable):
        return 0, 0
    total, distinct = rows[0]
    return int(total), int(distinct)  # type: ignore[call-overload]


async def stored_ids(dsn: str) -> set[str]:
    return {str(row[0]) for row in await raw_rows(dsn, "SELECT id FROM audit_events")}


async def wait_until(
    check: Callable[[], Awaitable[bool]], *, timeout: float, what: str, interval: float = 0.05
) -> None:
    """Poll ``check`` until true (no event exists for rows landing in a database)."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)  # the poll interval: rows landing announce nothing


async def wait_for_rows(dsn: str, expected: int, *, timeout: float = 60) -> None:
    async def done() -> bool:
        return (await counts(dsn))[0] >= expected

    await wait_until(done, timeout=timeout, what=f"{expected} rows")


async def fill_history(dsn: str, rows: int = HISTORY_ROWS) -> int:
    """Migrate the store behind ``dsn`` and fill it with ``rows`` served events of the
    last week (ids and request ids that no test uses; well inside the default 30-day
    retention, so none is deleted under a test), as a store in service holds: ingest and
    queries then run against indexes with data in them. Returns ``rows``."""
    store = await open_store(parse_dsn(dsn))
    try:
        await store.migrate()
        start = datetime.now(UTC) - timedelta(days=7)
        step = timedelta(days=7) / rows
        for first in range(0, rows, 1000):
            batch = [
                _history_event(i, start + i * step) for i in range(first, min(first + 1000, rows))
            ]
            await store.write([Incoming(e) for e in batch], [])
    finally:
        await store.close()
    return rows


_HISTORY_POOL = (
    PoolOutcome.SWAP_STARTED,
    PoolOutcome.SWAP_COMPLETED,
    PoolOutcome.BUSY_SKIP,
    PoolOutcome.LEASE_EXPIRED,
)


def _history_event(i: int, when: datetime) -> AuditEvent:
    """Mostly served requests, one in ten a pool event, each kind with its own fields."""
    if i % 10:
        outcome = RequestOutcome.SERVED if i % 7 else RequestOutcome.POOL_ACTIVATION_TIMEOUT
        return AuditEvent(
            kind="request",
            outcome=outcome,
            time=when,
            request_id=f"history-{i}",
            router="r1",
            rule="default",
            pool="gpu0",
            member="assistant",
            backend="assistant",
            status=200 if outcome is RequestOutcome.SERVED else 503,
            duration_ms=float(i % 500),
        )
    return pool_event(
        _HISTORY_POOL[(i // 10) % len(_HISTORY_POOL)],
        when,
        request_id=f"history-{i}",
        controller="c1",
        pool="gpu0",
        member="coder",
        from_member="assistant",
        to_member="coder",
        epoch=i,
    )


def postgres_schema_dsn(base: str, schema: str) -> str:
    """Create ``schema`` in the database behind ``base``; a DSN whose search path is it."""
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    separator = "&" if "?" in base else "?"
    return f"{base}{separator}options={quote(f'-csearch_path={schema}')}"


def drop_schema(base: str, schema: str) -> None:
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
