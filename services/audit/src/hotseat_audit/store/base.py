"""The audit store interface, and what both implementations share.

A store keeps each event exactly once (the event id is the primary key and inserts skip
ids already present), keeps dead letters once per stream position, answers filtered,
keyset-paginated queries newest first, and deletes rows past the retention age.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from hotseat_audit.decoding import DeadLetter, Incoming
from hotseat_audit.query import Cursor, EventFilter, Summary
from hotseat_common.messages.audit import AuditEvent

CACHE_FIELDS: tuple[str, ...] = (
    "cache_saved_bytes",
    "cache_saved_tokens",
    "cache_save_ms",
    "cache_restored_bytes",
    "cache_restored_tokens",
    "cache_restore_ms",
)
"""A swap's prompt-cache figures (migration 2)."""

OBSERVABILITY_FIELDS: tuple[str, ...] = (
    "swap_id",
    "unload_ms",
    "load_ms",
    "prompt_tokens",
    "completion_tokens",
    "api_key",
)
"""Swap ids and phase times, token usage and the client's key (migration 3)."""

EVENT_FIELDS: tuple[str, ...] = (
    "id",
    "time",
    "kind",
    "outcome",
    "request_id",
    "router",
    "controller",
    "rule",
    "pool",
    "member",
    "backend",
    "status",
    "duration_ms",
    "from_member",
    "to_member",
    "epoch",
    "reason",
    *CACHE_FIELDS,
    *OBSERVABILITY_FIELDS,
    "evicts",
    "placement",
    "also",
    "v",
)
"""Columns that hold the event itself, in :class:`AuditEvent` field order."""

STORED_FIELDS: tuple[str, ...] = (*EVENT_FIELDS, "stream_seq")

DEAD_LETTER_FIELDS = (
    "id",
    "stream",
    "stream_seq",
    "subject",
    "published",
    "payload",
    "reason",
    "detail",
    "received_at",
)

MAX_PAGE = 1000


class StoreError(RuntimeError):
    """The store could not complete an operation; the caller may retry it."""


@dataclass(slots=True)
class WriteResult:
    """What one committed batch changed."""

    stored: Counter[str] = field(default_factory=Counter)
    """New event rows by outcome."""
    duplicates: int = 0
    """Events whose id was already stored (redelivered or republished)."""
    dead_letters: Counter[str] = field(default_factory=Counter)
    """New dead-letter rows by reason."""


@dataclass(frozen=True, slots=True)
class StoredDeadLetter:
    id: int
    stream: str
    stream_seq: int
    subject: str
    published: datetime | None
    payload: bytes
    reason: str
    detail: str
    received_at: datetime


class AuditStore(ABC):
    """Where audit events live."""

    kind: ClassVar[str]

    @abstractmethod
    async def migrate(self) -> int:
        """Apply pending migrations; return the schema version now in place."""

    @abstractmethod
    async def write(self, events: Sequence[Incoming], dead: Sequence[DeadLetter]) -> WriteResult:
        """Store a batch in one transaction; ids already stored are skipped."""

    @abstractmethod
    async def events(
        self, filters: EventFilter, *, limit: int, after: Cursor | None = None
    ) -> list[AuditEvent]:
        """Up to ``limit`` matching events, newest first, strictly after ``after``."""

    @abstractmethod
    async def summary(self, since: datetime, until: datetime) -> Summary:
        """Counts of events with ``since <= time < until``."""

    @abstractmethod
    async def dead_letters(
        self, *, limit: int, before: int | None = None
    ) -> list[StoredDeadLetter]:
        """Newest dead letters first, those with an id below ``before`` when given."""

    @abstractmethod
    async def delete_older_than(self, cutoff: datetime, *, limit: int) -> int:
        """Delete up to ``limit`` events (and as many dead letters) older than ``cutoff``."""

    async def optimize(self) -> None:
        """Refresh planner statistics after large deletes, where the database needs it."""
        return

    @abstractmethod
    async def close(self) -> None:
        """Release connections; pending writes are already committed or rolled back."""


def event_row(incoming: Incoming, time_value: Callable[[datetime], Any]) -> tuple[Any, ...]:
    """The stored columns of one event, in :data:`STORED_FIELDS` order."""
    event = incoming.event
    values = [getattr(event, name) for name in EVENT_FIELDS]
    values[1] = time_value(event.time)
    values.append(incoming.stream_seq)
    return tuple(values)


def row_event(row: Sequence[Any], time: datetime) -> AuditEvent:
    """Rebuild an event from its :data:`EVENT_FIELDS` columns (validated when stored)."""
    values = dict(zip(EVENT_FIELDS, row, strict=False))
    values["time"] = time
    return AuditEvent.model_construct(**values)


def dead_letter_row(letter: DeadLetter, time_value: Callable[[datetime], Any]) -> tuple[Any, ...]:
    """The stored columns of one dead letter (from ``stream`` to ``detail``)."""
    origin = letter.origin
    published = time_value(origin.published) if origin.published else None
    return (
        origin.stream,
        origin.stream_seq,
        origin.subject,
        published,
        letter.payload,
        letter.reason.value,
        letter.detail,
    )


def row_dead_letter(row: Sequence[Any], time: Callable[[Any], datetime]) -> StoredDeadLetter:
    """Rebuild a dead letter from its :data:`DEAD_LETTER_FIELDS` columns."""
    return StoredDeadLetter(
        id=row[0],
        stream=row[1],
        stream_seq=row[2],
        subject=row[3],
        published=time(row[4]) if row[4] is not None else None,
        payload=bytes(row[5]),
        reason=row[6],
        detail=row[7],
        received_at=time(row[8]),
    )


def event_conditions(
    filters: EventFilter,
    after: Cursor | None,
    *,
    placeholder: str,
    time_value: Callable[[datetime], Any],
) -> tuple[str, list[Any]]:
    """The WHERE clause (or "") and its parameters for a filtered, paged event query."""
    clauses: list[str] = []
    params: list[Any] = []
    for name, values in filters.equalities():
        if len(values) == 1:
            clauses.append(f"{name} = {placeholder}")
        else:
            clauses.append(f"{name} IN ({', '.join([placeholder] * len(values))})")
        params.extend(values)
    if filters.since is not None:
        clauses.append(f"time >= {placeholder}")
        params.append(time_value(filters.since))
    if filters.until is not None:
        clauses.append(f"time < {placeholder}")
        params.append(time_value(filters.until))
    if after is not None:
        clauses.append(f"(time, id) < ({placeholder}, {placeholder})")
        params.extend([time_value(after.time), after.id])
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    return where, params


def select_events_sql(where: str, placeholder: str) -> str:
    return (
        f"SELECT {', '.join(EVENT_FIELDS)} FROM audit_events {where} "  # noqa: S608 - names are ours
        f"ORDER BY time DESC, id DESC LIMIT {placeholder}"
    )


SUMMARY_GROUPS = "kind, outcome, pool, member, rule"
