"""The PostgreSQL audit store: psycopg 3 (async) with a small connection pool.

A batch of events is one ``INSERT ... SELECT FROM unnest(...) ON CONFLICT (id) DO
NOTHING RETURNING outcome`` statement, so the round trips of a batch do not grow with
its size and the rows returned are exactly the ones that were new. Migrations run under
an advisory lock, so replicas starting together apply them once.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from hotseat_audit.decoding import DeadLetter, Incoming
from hotseat_audit.query import Cursor, EventFilter, Summary
from hotseat_audit.store.base import (
    DEAD_LETTER_FIELDS,
    STORED_FIELDS,
    SUMMARY_GROUPS,
    AuditStore,
    StoredDeadLetter,
    StoreError,
    WriteResult,
    dead_letter_row,
    event_conditions,
    event_row,
    row_dead_letter,
    row_event,
    select_events_sql,
)
from hotseat_audit.store.migrations import pending
from hotseat_common.messages.audit import AuditEvent

CONNECT_TIMEOUT = 10.0
STATEMENT_TIMEOUT = "30s"
MIGRATION_LOCK = 0x686F74736561  # "hotseat" in hex: one advisory lock key for migrations

_ARRAY_TYPES = {
    "time": "timestamptz[]",
    "status": "int4[]",
    "duration_ms": "float8[]",
    "epoch": "int8[]",
    "cache_saved_bytes": "int8[]",
    "cache_saved_tokens": "int8[]",
    "cache_save_ms": "float8[]",
    "cache_restored_bytes": "int8[]",
    "cache_restored_tokens": "int8[]",
    "cache_restore_ms": "float8[]",
    "unload_ms": "float8[]",
    "load_ms": "float8[]",
    "prompt_tokens": "int8[]",
    "completion_tokens": "int8[]",
    "v": "int2[]",
    "stream_seq": "int8[]",
}
_INSERT_EVENTS = (
    f"INSERT INTO audit_events ({', '.join(STORED_FIELDS)}) "  # noqa: S608 - names are ours
    "SELECT * FROM unnest("
    + ", ".join(f"%s::{_ARRAY_TYPES.get(name, 'text[]')}" for name in STORED_FIELDS)
    + ") ON CONFLICT (id) DO NOTHING RETURNING outcome"
)
_INSERT_DEAD = (
    "INSERT INTO audit_dead_letters "
    "(stream, stream_seq, subject, published, payload, reason, detail) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (stream, stream_seq) DO NOTHING "
    "RETURNING reason"
)

_DB_ERRORS = (psycopg.Error, PoolTimeout)


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute(f"SET statement_timeout = '{STATEMENT_TIMEOUT}'")
    await conn.execute("SET TIME ZONE 'UTC'")  # times read back in UTC, as SQLite gives them


def _identity(moment: datetime) -> datetime:
    return moment


class PostgresStore(AuditStore):
    kind = "postgres"

    def __init__(self, pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]]) -> None:
        self._pool = pool

    @classmethod
    async def open(cls, dsn: str, *, max_size: int = 4) -> PostgresStore:
        pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=max_size,
            open=False,
            timeout=CONNECT_TIMEOUT,
            kwargs={"autocommit": True, "connect_timeout": int(CONNECT_TIMEOUT)},
            configure=_configure,
            check=AsyncConnectionPool.check_connection,
            name="hotseat-audit",
        )
        try:
            await pool.open(wait=True, timeout=CONNECT_TIMEOUT)
        except _DB_ERRORS as exc:
            await pool.close()
            raise StoreError(f"cannot connect to the PostgreSQL audit store: {exc}") from exc
        return cls(pool)

    async def migrate(self) -> int:
        try:
            async with self._pool.connection() as conn, conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_version (version integer PRIMARY KEY, "
                    "name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
                )
                cur = await conn.execute("SELECT coalesce(max(version), 0) FROM schema_version")
                row = await cur.fetchone()
                current = int(row[0]) if row else 0
                for migration in pending(current):
                    for sql in migration.postgres:
                        await conn.execute(sql)
                    await conn.execute(
                        "INSERT INTO schema_version (version, name) VALUES (%s, %s)",
                        (migration.version, migration.name),
                    )
                    current = migration.version
        except _DB_ERRORS as exc:
            raise StoreError(f"PostgreSQL migration failed: {exc}") from exc
        return current

    async def write(self, events: Sequence[Incoming], dead: Sequence[DeadLetter]) -> WriteResult:
        result = WriteResult()
        unique: dict[str, Incoming] = {}
        for incoming in events:
            if incoming.event.id in unique:
                result.duplicates += 1
            else:
                unique[incoming.event.id] = incoming
        try:
            async with self._pool.connection() as conn, conn.transaction():
                if unique:
                    rows = [event_row(i, _identity) for i in unique.values()]
                    columns = [list(column) for column in zip(*rows, strict=True)]
                    cur = await conn.execute(_INSERT_EVENTS, columns)
                    inserted = await cur.fetchall()
                    for (outcome,) in inserted:
                        result.stored[outcome] += 1
                    result.duplicates += len(unique) - len(inserted)
                for letter in dead:
                    cur = await conn.execute(_INSERT_DEAD, dead_letter_row(letter, _identity))
                    if await cur.fetchone() is not None:
                        result.dead_letters[letter.reason.value] += 1
        except _DB_ERRORS as exc:
            raise StoreError(f"PostgreSQL write failed: {exc}") from exc
        return result

    async def events(
        self, filters: EventFilter, *, limit: int, after: Cursor | None = None
    ) -> list[AuditEvent]:
        where, params = event_conditions(filters, after, placeholder="%s", time_value=_identity)
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(
                    select_events_sql(where, "%s"),
                    [*params, limit],
                )
                rows = await cur.fetchall()
        except _DB_ERRORS as exc:
            raise StoreError(f"PostgreSQL query failed: {exc}") from exc
        return [row_event(row, row[1]) for row in rows]

    async def summary(self, since: datetime, until: datetime) -> Summary:
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(
                    f"SELECT {SUMMARY_GROUPS}, count(*) FROM audit_events "  # noqa: S608
                    f"WHERE time >= %s AND time < %s GROUP BY {SUMMARY_GROUPS}",
                    (since, until),
                )
                rows = await cur.fetchall()
        except _DB_ERRORS as exc:
            raise StoreError(f"PostgreSQL query failed: {exc}") from exc
        return Summary.of_rows(since, until, rows)

    async def dead_letters(
        self, *, limit: int, before: int | None = None
    ) -> list[StoredDeadLetter]:
        where, params = ("WHERE id < %s", [before]) if before is not None else ("", [])
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(
                    f"SELECT {', '.join(DEAD_LETTER_FIELDS)} FROM audit_dead_letters {where} "  # noqa: S608
                    "ORDER BY id DESC LIMIT %s",
                    [*params, limit],
                )
                rows = await cur.fetchall()
        except _DB_ERRORS as exc:
            raise StoreError(f"PostgreSQL query failed: {exc}") from exc
        return [row_dead_letter(row, _identity) for row in rows]

    async def delete_older_than(self, cutoff: datetime, *, limit: int) -> int:
        try:
            async with self._pool.connection() as conn, conn.transaction():
                cur = await conn.execute(
                    "DELETE FROM audit_events WHERE id IN "
                    "(SELECT id FROM audit_events WHERE time < %s LIMIT %s)",
                    (cutoff, limit),
                )
                deleted = cur.rowcount
                await conn.execute(
                    "DELETE FROM audit_dead_letters WHERE id IN "
                    "(SELECT id FROM audit_dead_letters WHERE received_at < %s LIMIT %s)",
                    (cutoff, limit),
                )
        except _DB_ERRORS as exc:
            raise StoreError(f"PostgreSQL delete failed: {exc}") from exc
        return deleted

    async def close(self) -> None:
        await self._pool.close()
