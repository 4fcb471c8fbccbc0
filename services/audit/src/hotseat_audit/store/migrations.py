"""Versioned schema migrations, one list for both stores.

Each migration has the same meaning in SQLite and PostgreSQL; only the SQL dialect
differs. Stores record applied versions in ``schema_version`` and apply the missing ones
at start-up, in order, in one transaction (DDL is transactional in both). A database
whose version is newer than this code knows is refused: an older binary must not write
into a newer schema.

Times are ``timestamptz`` in PostgreSQL and integer microseconds since the Unix epoch
(UTC) in SQLite, so both order and compare exactly.

The indexes follow the query API: every filter column leads an index that continues with
``(time, id)``, so "newest first, filtered, after this cursor" is one index range scan.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sqlite: tuple[str, ...]
    postgres: tuple[str, ...]


class SchemaTooNew(RuntimeError):
    """The database was migrated by a newer Hotseat than this one."""


_FILTER_INDEXES = (
    ("outcome", "outcome, time, id"),
    ("kind", "kind, time, id"),
    ("pool", "pool, member, time, id"),
    ("member", "member, time, id"),
    ("router", "router, time, id"),
    ("rule", "rule, time, id"),
    ("request", "request_id, time, id"),
)
"""Migration 1's indexes; later migrations add their own."""


def _indexes() -> tuple[str, ...]:
    statements = ["CREATE INDEX audit_events_time ON audit_events (time, id)"]
    statements += [
        f"CREATE INDEX audit_events_{name} ON audit_events ({columns})"
        for name, columns in _FILTER_INDEXES
    ]
    return tuple(statements)


_V1_SQLITE = (
    """
    CREATE TABLE audit_events (
        id          TEXT PRIMARY KEY,
        time        INTEGER NOT NULL,
        kind        TEXT NOT NULL,
        outcome     TEXT NOT NULL,
        request_id  TEXT,
        router      TEXT,
        controller  TEXT,
        rule        TEXT,
        pool        TEXT,
        member      TEXT,
        backend     TEXT,
        status      INTEGER,
        duration_ms REAL,
        from_member TEXT,
        to_member   TEXT,
        epoch       INTEGER,
        reason      TEXT,
        v           INTEGER NOT NULL,
        stream_seq  INTEGER,
        stored_at   INTEGER NOT NULL
    )
    """,
    *_indexes(),
    """
    CREATE TABLE audit_dead_letters (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        stream      TEXT NOT NULL,
        stream_seq  INTEGER NOT NULL,
        subject     TEXT NOT NULL,
        published   INTEGER,
        payload     BLOB NOT NULL,
        reason      TEXT NOT NULL,
        detail      TEXT NOT NULL,
        received_at INTEGER NOT NULL,
        UNIQUE (stream, stream_seq)
    )
    """,
    "CREATE INDEX audit_dead_letters_received ON audit_dead_letters (received_at)",
)

_V1_POSTGRES = (
    """
    CREATE TABLE audit_events (
        id          text PRIMARY KEY,
        time        timestamptz NOT NULL,
        kind        text NOT NULL,
        outcome     text NOT NULL,
        request_id  text,
        router      text,
        controller  text,
        rule        text,
        pool        text,
        member      text,
        backend     text,
        status      integer,
        duration_ms double precision,
        from_member text,
        to_member   text,
        epoch       bigint,
        reason      text,
        v           smallint NOT NULL,
        stream_seq  bigint,
        stored_at   timestamptz NOT NULL DEFAULT now()
    )
    """,
    *_indexes(),
    """
    CREATE TABLE audit_dead_letters (
        id          bigserial PRIMARY KEY,
        stream      text NOT NULL,
        stream_seq  bigint NOT NULL,
        subject     text NOT NULL,
        published   timestamptz,
        payload     bytea NOT NULL,
        reason      text NOT NULL,
        detail      text NOT NULL,
        received_at timestamptz NOT NULL DEFAULT now(),
        UNIQUE (stream, stream_seq)
    )
    """,
    "CREATE INDEX audit_dead_letters_received ON audit_dead_letters (received_at)",
)

_V2_COLUMNS = (
    ("cache_saved_bytes", "INTEGER", "bigint"),
    ("cache_saved_tokens", "INTEGER", "bigint"),
    ("cache_save_ms", "REAL", "double precision"),
    ("cache_restored_bytes", "INTEGER", "bigint"),
    ("cache_restored_tokens", "INTEGER", "bigint"),
    ("cache_restore_ms", "REAL", "double precision"),
)
"""A swap's prompt-cache figures (docs/adr/0007): nullable, so old rows need nothing."""

_V3_COLUMNS = (
    ("swap_id", "TEXT", "text"),
    ("unload_ms", "REAL", "double precision"),
    ("load_ms", "REAL", "double precision"),
    ("prompt_tokens", "INTEGER", "bigint"),
    ("completion_tokens", "INTEGER", "bigint"),
    ("api_key", "TEXT", "text"),
)
"""Swap ids and phase times, token usage and the client's key: nullable, so old rows
need nothing; the swap id leads an index, as every filter column does."""
_V3_INDEX = "CREATE INDEX audit_events_swap ON audit_events (swap_id, time, id)"

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "events and dead letters", sqlite=_V1_SQLITE, postgres=_V1_POSTGRES),
    Migration(
        2,
        "prompt-cache figures of swaps",
        sqlite=tuple(f"ALTER TABLE audit_events ADD COLUMN {n} {t}" for n, t, _ in _V2_COLUMNS),
        postgres=tuple(f"ALTER TABLE audit_events ADD COLUMN {n} {t}" for n, _, t in _V2_COLUMNS),
    ),
    Migration(
        3,
        "swap ids, phase times and token usage",
        sqlite=(
            *(f"ALTER TABLE audit_events ADD COLUMN {n} {t}" for n, t, _ in _V3_COLUMNS),
            _V3_INDEX,
        ),
        postgres=(
            *(f"ALTER TABLE audit_events ADD COLUMN {n} {t}" for n, _, t in _V3_COLUMNS),
            _V3_INDEX,
        ),
    ),
    Migration(
        4,
        "the members a capacity pool's swap evicts",
        sqlite=("ALTER TABLE audit_events ADD COLUMN evicts TEXT",),
        postgres=("ALTER TABLE audit_events ADD COLUMN evicts text",),
    ),
    Migration(
        5,
        "why a model group's request went to its pool",
        sqlite=("ALTER TABLE audit_events ADD COLUMN placement TEXT",),
        postgres=("ALTER TABLE audit_events ADD COLUMN placement text",),
    ),
    Migration(
        6,
        "the other members a capacity pool's swap loads beside its target",
        sqlite=("ALTER TABLE audit_events ADD COLUMN also TEXT",),
        postgres=("ALTER TABLE audit_events ADD COLUMN also text",),
    ),
)

LATEST = MIGRATIONS[-1].version


def pending(current: int) -> list[Migration]:
    """The migrations to apply to a database at version ``current``, in order."""
    if current > LATEST:
        raise SchemaTooNew(
            f"audit store schema is version {current}, this hotseat-audit knows up to {LATEST}"
        )
    return [m for m in MIGRATIONS if m.version > current]
