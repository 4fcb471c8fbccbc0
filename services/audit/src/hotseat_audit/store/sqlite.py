"""The SQLite audit store: one file in WAL mode, one writer connection, one reader.

Writes are serialised by a lock on the writer connection and run as ``BEGIN IMMEDIATE``
transactions, so the check for ids already stored and the insert see the same snapshot.
``synchronous=FULL`` makes a commit survive power loss as well as a crash: a message is
acknowledged to JetStream only after its row is durable. Reads use their own connection
and, thanks to WAL, never wait for a write.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time as _time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import aiosqlite

from hotseat_audit.decoding import DeadLetter, Incoming
from hotseat_audit.query import Cursor, EventFilter, Summary, from_micros, to_micros
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

BUSY_TIMEOUT_MS = 5000
ID_CHUNK = 500

_INSERT_EVENT = (
    f"INSERT INTO audit_events ({', '.join(STORED_FIELDS)}, stored_at) "  # noqa: S608 - our names
    f"VALUES ({', '.join('?' * len(STORED_FIELDS))}, ?) ON CONFLICT (id) DO NOTHING"
)
_INSERT_DEAD = (
    "INSERT INTO audit_dead_letters "
    "(stream, stream_seq, subject, published, payload, reason, detail, received_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (stream, stream_seq) DO NOTHING"
)


def _now_us() -> int:
    return _time.time_ns() // 1000


class SQLiteStore(AuditStore):
    kind = "sqlite"

    def __init__(
        self, path: Path, writer: aiosqlite.Connection, reader: aiosqlite.Connection
    ) -> None:
        self.path = path
        self._writer = writer
        self._reader = reader
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, path: Path) -> SQLiteStore:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            writer = await aiosqlite.connect(path, isolation_level=None)
            for pragma in (
                "PRAGMA journal_mode=WAL",
                "PRAGMA synchronous=FULL",
                f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}",
            ):
                await writer.execute(pragma)
            reader = await aiosqlite.connect(path, isolation_level=None)
            await reader.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            await reader.execute("PRAGMA query_only=1")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite audit store at {path}: {exc}") from exc
        return cls(path, writer, reader)

    async def migrate(self) -> int:
        async with self._lock:
            await self._writer.execute(
                "CREATE TABLE IF NOT EXISTS schema_version "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)"
            )
            # One IMMEDIATE transaction: a second process starting at the same moment
            # waits, then finds the work done.
            await self._writer.execute("BEGIN IMMEDIATE")
            try:
                rows = await self._writer.execute_fetchall(
                    "SELECT coalesce(max(version), 0) FROM schema_version"
                )
                current = int(next(iter(rows))[0])
                for migration in pending(current):
                    for sql in migration.sqlite:
                        await self._writer.execute(sql)
                    await self._writer.execute(
                        "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)",
                        (migration.version, migration.name, _now_us()),
                    )
                    current = migration.version
                await self._writer.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    await self._writer.execute("ROLLBACK")
                raise
            return current

    async def write(self, events: Sequence[Incoming], dead: Sequence[DeadLetter]) -> WriteResult:
        result = WriteResult()
        now = _now_us()
        try:
            async with self._lock:
                await self._writer.execute("BEGIN IMMEDIATE")
                try:
                    await self._write_locked(events, dead, now, result)
                    await self._writer.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        await self._writer.execute("ROLLBACK")
                    raise
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite write failed: {exc}") from exc
        return result

    async def _write_locked(
        self, events: Sequence[Incoming], dead: Sequence[DeadLetter], now: int, result: WriteResult
    ) -> None:
        seen: set[str] = set()
        ids = list({i.event.id for i in events})
        for start in range(0, len(ids), ID_CHUNK):
            chunk = ids[start : start + ID_CHUNK]
            rows = await self._writer.execute_fetchall(
                f"SELECT id FROM audit_events WHERE id IN ({', '.join('?' * len(chunk))})",  # noqa: S608
                chunk,
            )
            seen.update(row[0] for row in rows)
        fresh: list[tuple[Any, ...]] = []
        for incoming in events:
            if incoming.event.id in seen:
                result.duplicates += 1
                continue
            seen.add(incoming.event.id)
            fresh.append((*event_row(incoming, to_micros), now))
            result.stored[incoming.event.outcome] += 1
        if fresh:
            await self._writer.executemany(_INSERT_EVENT, fresh)
        for letter in dead:
            cursor = await self._writer.execute(
                _INSERT_DEAD, (*dead_letter_row(letter, to_micros), now)
            )
            if cursor.rowcount == 1:
                result.dead_letters[letter.reason.value] += 1

    async def events(
        self, filters: EventFilter, *, limit: int, after: Cursor | None = None
    ) -> list[AuditEvent]:
        where, params = event_conditions(filters, after, placeholder="?", time_value=to_micros)
        try:
            rows = await self._reader.execute_fetchall(
                select_events_sql(where, "?"), [*params, limit]
            )
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite query failed: {exc}") from exc
        return [row_event(row, from_micros(row[1])) for row in rows]

    async def summary(self, since: datetime, until: datetime) -> Summary:
        try:
            rows = await self._reader.execute_fetchall(
                f"SELECT {SUMMARY_GROUPS}, count(*) FROM audit_events "  # noqa: S608 - our names
                f"WHERE time >= ? AND time < ? GROUP BY {SUMMARY_GROUPS}",
                (to_micros(since), to_micros(until)),
            )
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite query failed: {exc}") from exc
        return Summary.of_rows(since, until, rows)

    async def dead_letters(
        self, *, limit: int, before: int | None = None
    ) -> list[StoredDeadLetter]:
        where, params = ("WHERE id < ?", [before]) if before is not None else ("", [])
        try:
            rows = await self._reader.execute_fetchall(
                f"SELECT {', '.join(DEAD_LETTER_FIELDS)} FROM audit_dead_letters {where} "  # noqa: S608
                "ORDER BY id DESC LIMIT ?",
                [*params, limit],
            )
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite query failed: {exc}") from exc
        return [row_dead_letter(row, from_micros) for row in rows]

    async def delete_older_than(self, cutoff: datetime, *, limit: int) -> int:
        micros = to_micros(cutoff)
        try:
            async with self._lock:
                cursor = await self._writer.execute(
                    "DELETE FROM audit_events WHERE rowid IN "
                    "(SELECT rowid FROM audit_events WHERE time < ? LIMIT ?)",
                    (micros, limit),
                )
                deleted = cursor.rowcount
                await self._writer.execute(
                    "DELETE FROM audit_dead_letters WHERE id IN "
                    "(SELECT id FROM audit_dead_letters WHERE received_at < ? LIMIT ?)",
                    (micros, limit),
                )
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite delete failed: {exc}") from exc
        return int(deleted)

    async def optimize(self) -> None:
        """Refresh the planner's statistics (cheap; SQLite decides what needs it)."""
        async with self._lock:
            await self._writer.execute("PRAGMA optimize")

    async def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            await self.optimize()
        await self._reader.close()
        await self._writer.close()
