"""Audit fixtures: a store DSN per backend (a SQLite file, or a private PostgreSQL schema),
an opened and migrated store, and a factory that runs ``hotseat-audit`` as a subprocess."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from hotseat.launcher import Managed, free_port, start_service
from hotseat_audit.store import AuditStore, open_store, parse_dsn
from tests.audit.support import drop_schema, postgres_schema_dsn


@pytest.fixture(params=["sqlite", "postgres"])
def store_dsn(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> Iterator[str]:
    """A DSN for an empty audit store of each kind."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'data' / 'audit.db'}"
        return
    base: str = request.getfixturevalue("postgres_dsn")
    yield postgres_schema_dsn(base, prefix)
    drop_schema(base, prefix)


@pytest.fixture
async def store(store_dsn: str) -> AsyncIterator[AuditStore]:
    """An opened, migrated store; closed after the test."""
    opened = await open_store(parse_dsn(store_dsn))
    await opened.migrate()
    yield opened
    await opened.close()


AuditFactory = Callable[..., Managed]


@pytest.fixture
def start_audit(nats_server: Managed, prefix: str, tmp_path: Path) -> Iterator[AuditFactory]:
    """Start ``hotseat-audit`` for this test's prefix and stream; stopped at teardown."""
    started: list[Managed] = []

    def start(dsn: str, *extra: str, port: int | None = None) -> Managed:
        args = [
            "--nats-url", nats_server.url,
            "--subject-prefix", prefix,
            "--audit-stream", stream_name(prefix),
            "--dsn", dsn,
            "--log-format", "json",
            *extra,
        ]  # fmt: skip
        proc = start_service(
            "audit",
            "hotseat-audit",
            args,
            port=port or free_port(),
            log_dir=tmp_path / "logs" / str(len(started)),
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def stream_name(prefix: str) -> str:
    return f"AUDIT_{prefix}"
