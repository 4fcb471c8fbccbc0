"""Private infrastructure for a test session: NATS, Redis, a fresh PostgreSQL database."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

DEFAULT_POSTGRES_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def postgres_admin_dsn() -> str:
    return os.environ.get("HOTSEAT_TEST_POSTGRES_DSN", DEFAULT_POSTGRES_DSN)


@contextmanager
def fresh_postgres_database() -> Iterator[str]:
    """Create a uniquely named database, yield its DSN, drop it afterwards."""
    admin = postgres_admin_dsn()
    name = f"hotseat_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = admin.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def unique_prefix() -> str:
    """A subject/key/stream prefix no other test uses."""
    return "t" + uuid.uuid4().hex[:12]


def worker_free_ports(worker: str, workers: int, span: tuple[int, int]) -> str:
    """Test worker ``worker``'s share of ``span`` (``gw0`` the first of ``workers`` equal
    slices), as a ``HOTSEAT_FREE_PORTS`` value."""
    index = int(worker.removeprefix("gw"))
    size = (span[1] - span[0] + 1) // workers
    first = span[0] + index * size
    return f"{first}-{first + size - 1}"
