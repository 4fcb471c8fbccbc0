"""Audit stores: SQLite (default, a file in a data dir) and PostgreSQL, chosen by DSN."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

from hotseat_audit.store.base import AuditStore, StoredDeadLetter, StoreError, WriteResult

__all__ = [
    "AuditStore",
    "StoreError",
    "StoreTarget",
    "StoredDeadLetter",
    "WriteResult",
    "open_store",
    "parse_dsn",
]


@dataclass(frozen=True, slots=True)
class StoreTarget:
    kind: Literal["sqlite", "postgres"]
    location: str
    """The SQLite file path, or the PostgreSQL DSN."""

    def describe(self) -> str:
        """Where the store is, without any password."""
        if self.kind == "sqlite":
            return f"sqlite:{self.location}"
        parts = urlsplit(self.location)
        host = parts.hostname or "local socket"
        port = f":{parts.port}" if parts.port else ""
        return f"postgres:{host}{port}{parts.path}"


def parse_dsn(dsn: str) -> StoreTarget:
    """Read ``sqlite:///rel/path.db``, ``sqlite:////abs/path.db`` or ``postgresql://...``."""
    scheme, sep, rest = dsn.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise ValueError(f"audit DSN {dsn!r} has no scheme (sqlite:/// or postgresql://)")
    if scheme in {"postgresql", "postgres"}:
        return StoreTarget("postgres", dsn)
    if scheme == "sqlite":
        if not rest.startswith("/") or rest == "/":
            raise ValueError(
                f"audit DSN {dsn!r}: use sqlite:///relative/file.db or sqlite:////absolute/file.db"
            )
        path = unquote(rest[1:].split("?", 1)[0])
        if path in {":memory:", ""}:
            raise ValueError("the audit store must be a file: an in-memory database loses events")
        return StoreTarget("sqlite", path)
    raise ValueError(f"audit DSN {dsn!r}: unsupported scheme {scheme!r} (sqlite or postgresql)")


async def open_store(target: StoreTarget) -> AuditStore:
    """Connect to the store (not yet migrated)."""
    if target.kind == "sqlite":
        from hotseat_audit.store.sqlite import SQLiteStore  # noqa: PLC0415 - only the one in use

        return await SQLiteStore.open(Path(target.location))
    from hotseat_audit.store.postgres import PostgresStore  # noqa: PLC0415 - only the one in use

    return await PostgresStore.open(target.location)
