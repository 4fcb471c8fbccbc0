"""Session-wide real infrastructure: private nats-server (JetStream) and redis-server on
free ports, started by the same launcher ``hotseat up`` uses, plus a fresh PostgreSQL
database. Tests isolate themselves further with a unique prefix for subjects, keys and
streams."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from nats.aio.client import Client as NatsClient

from hotseat.launcher import FREE_PORTS_ENV, Managed, free_port_range, start_nats, start_redis
from hotseat_common.connections import open_nats
from hotseat_common.settings import RedisSettings
from hotseat_pool_controller.store.link import RedisLink
from tests.support.infra import fresh_postgres_database, unique_prefix, worker_free_ports


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker hands out free ports from its own slice of the range, and
    so do the processes its tests start (they inherit the variable): one worker's "nothing
    listens here" port, or a port its server has not bound yet, is never another's."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return
    span = free_port_range()
    if span is None:
        return
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ[FREE_PORTS_ENV] = worker_free_ports(worker, workers, span)


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hotseat")


@pytest.fixture(scope="session")
def nats_server(session_dir: Path) -> Iterator[Managed]:
    proc = start_nats(session_dir / "nats")
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def redis_server(session_dir: Path) -> Iterator[Managed]:
    proc = start_redis(session_dir / "redis")
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    with fresh_postgres_database() as dsn:
        yield dsn


@pytest.fixture
def prefix() -> str:
    return unique_prefix()


@pytest.fixture
async def nc(nats_server: Managed) -> AsyncIterator[NatsClient]:
    client = await open_nats(nats_server.url, connect_timeout=2)
    yield client
    await client.drain()


@pytest.fixture
async def link(redis_server: Managed) -> AsyncIterator[RedisLink]:
    """The controller's own pipelined connection to the session's Redis."""
    client = RedisLink(RedisSettings(redis_url=redis_server.url))
    yield client
    await client.aclose()


@pytest.fixture
async def redis(redis_server: Managed) -> AsyncIterator[aioredis.Redis]:
    client: aioredis.Redis = aioredis.from_url(redis_server.url, decode_responses=True)
    yield client
    await client.aclose()
