"""The launcher starts private NATS (JetStream) and Redis, detects running ones, leaves no
process behind."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from hotseat.launcher import (
    Managed,
    ephemeral_ports,
    free_port,
    nats_reachable,
    redis_reachable,
    start_nats,
    start_redis,
)
from hotseat_common.connections import open_nats


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); its /proc status says so.
    status = Path(f"/proc/{pid}/status")
    return not status.exists() or "State:\tZ" in status.read_text()


async def test_nats_starts_with_jetstream_and_stops(tmp_path: Path) -> None:
    """A launched nats-server answers, has JetStream enabled, and is gone after stop."""
    proc = start_nats(tmp_path)
    try:
        assert nats_reachable(proc.url)
        nc = await open_nats(proc.url)
        info = await nc.jetstream().account_info()
        assert info.limits is not None
        await nc.close()
    finally:
        proc.stop()
    assert _gone(proc.pid)
    assert not nats_reachable(proc.url)


async def test_redis_starts_and_stops(tmp_path: Path) -> None:
    """A launched redis-server answers PING and is gone after stop."""
    proc = start_redis(tmp_path)
    try:
        client: aioredis.Redis = aioredis.from_url(proc.url)
        assert await client.ping()
        await client.aclose()
    finally:
        proc.stop()
    assert _gone(proc.pid)
    assert not redis_reachable(proc.url)


def test_reachability_detects_running_servers(nats_server: Managed, redis_server: Managed) -> None:
    """Running servers are detected (so they are reused), a closed port is not."""
    assert nats_reachable(nats_server.url)
    assert redis_reachable(redis_server.url)
    assert not nats_reachable(redis_server.url.replace("redis", "nats"))
    assert not redis_reachable("redis://127.0.0.1:1/0")


def test_free_ports_are_taken_below_the_kernels_ephemeral_range() -> None:
    """A port from the ephemeral range can become an outgoing connection's source port
    before the server that was given it binds it; free_port takes none of those, never
    hands out one port twice, and each can be bound."""
    ephemeral = ephemeral_ports()
    if ephemeral is None:
        pytest.skip("the kernel's ephemeral range cannot be read here")
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(not ephemeral[0] <= p <= ephemeral[1] for p in ports), ports
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", ports[-1]))
