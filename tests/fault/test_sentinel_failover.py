"""Redis as production runs it: the controllers reach the pool store through Redis
Sentinel, and the primary fails over mid-traffic (docs/reliability.md guarantee 26).

A primary, a replica and a Sentinel, all real redis-server processes on this machine;
the sims keep their ledger on the session's Redis, so the verdict sees the truth."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from hotseat.launcher import Managed, find_binary, free_port, spawn, start_redis, wait_for_marker
from tests.fault.conftest import MakeFaultStack
from tests.support.clients import chat, live_stream
from tests.support.faultstack import FaultStack
from tests.support.procs import kill
from tests.support.stack import eventually, pool_stack_config

pytestmark = pytest.mark.fault

MASTER_NAME = "hotseat-test"


@dataclass
class SentinelSet:
    primary: Managed
    replica: Managed
    sentinel: Managed
    sentinel_port: int

    @property
    def sentinels(self) -> str:
        return f"127.0.0.1:{self.sentinel_port}"

    def all(self) -> list[Managed]:
        return [self.primary, self.replica, self.sentinel]


def start_sentinel(workdir: Path, primary_port: int) -> tuple[Managed, int]:
    """One Sentinel watching ``primary_port``; it declares the primary down after 1 s."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "sentinel.conf"  # Sentinel rewrites its own file: it must be writable
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {workdir}\n"
        f"sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 1\n"
        f"sentinel down-after-milliseconds {MASTER_NAME} 1000\n"
        f"sentinel failover-timeout {MASTER_NAME} 10000\n"
        f"sentinel parallel-syncs {MASTER_NAME} 1\n"
    )
    proc = spawn(
        "sentinel",
        [find_binary("redis-server"), str(conf), "--sentinel"],
        url=f"redis://127.0.0.1:{port}",
        log_path=workdir / "sentinel.log",
        ready_marker="+monitor master",
    )
    wait_for_marker(proc, 15)
    return proc, port


@pytest.fixture
def sentinel_set(tmp_path: Path) -> Iterator[SentinelSet]:
    primary = start_redis(tmp_path / "primary")
    primary_port = int(primary.url.rsplit(":", 1)[1].split("/")[0])
    replica = start_redis(
        tmp_path / "replica", extra_args=["--replicaof", "127.0.0.1", str(primary_port)]
    )
    sentinel, port = start_sentinel(tmp_path / "sentinel", primary_port)
    found = SentinelSet(primary, replica, sentinel, port)
    yield found
    for proc in found.all():
        proc.stop(5)


async def primary_port(sentinels: SentinelSet) -> int:
    client: aioredis.Redis = aioredis.from_url(sentinels.sentinel.url, decode_responses=True)
    try:
        _host, port = await client.execute_command(
            "SENTINEL", "get-master-addr-by-name", MASTER_NAME
        )
        return int(port)
    finally:
        await client.aclose()


async def replica_in_sync(replica: Managed) -> bool:
    client: aioredis.Redis = aioredis.from_url(replica.url, decode_responses=True)
    try:
        info = await client.info("replication")
        return info.get("master_link_status") == "up"
    finally:
        await client.aclose()


async def test_the_primary_fails_over_mid_stream_and_the_contract_holds(
    make_stack: MakeFaultStack, sentinel_set: SentinelSet
) -> None:
    """Controllers on Sentinel; the primary is SIGKILLed under a stream on judge and the
    replica is promoted: the controllers follow the failover, treat the promoted server as
    one that may have lost writes (the resident is busy while routers renew their leases
    back), the stream runs to its end, and a Wait request for coder sent after the
    failover is served once the stream has ended; nothing overlaps and nothing is cut."""
    await eventually(lambda: replica_in_sync(sentinel_set.replica), timeout=15)
    stack: FaultStack = make_stack(
        pool_stack_config(pool={"leaseTtl": "6s"}),
        extra_env={
            "HOTSEAT_REDIS_SENTINELS": sentinel_set.sentinels,
            "HOTSEAT_REDIS_SENTINEL_MASTER": MASTER_NAME,
        },
    )
    stack.controller_redis_url = sentinel_set.primary.url  # scheme and database only
    stack.start_sims()
    stack.start_controller("c1")
    stack.start_controller("c2")
    router = stack.start_router()
    await stack.wait_resident("judge", timeout=30)
    first = await primary_port(sentinel_set)
    async with live_stream(router.url, "judge", max_tokens=200) as stream:  # 10 s
        kill(sentinel_set.primary)
        await eventually(lambda: _promoted(sentinel_set, first), timeout=30, interval=0.1)
        stack.controller_redis_url = sentinel_set.replica.url  # where the tests read state
        await eventually(lambda: _relearned(stack), timeout=30, interval=0.05)
        # A controller fails closed until its store probe has seen the new primary.
        await eventually(lambda: _controllers_ready(stack), timeout=30, interval=0.05)
        held = asyncio.create_task(chat(router.url, "coder", timeout=90))
        result = await stream
    answer = await held
    assert result.clean, result
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-hotseat-backend"] == "coder"
    await stack.assert_invariants()
    logs = "\n".join(p.log_text() for p in stack.controllers.values())
    assert "pool_state_rebuilt" in logs


async def _controllers_ready(stack: FaultStack) -> bool:
    async with httpx.AsyncClient(timeout=2) as client:
        for controller in stack.controllers.values():
            if (await client.get(f"{controller.url}/readyz")).status_code != 200:
                return False
    return True


async def _promoted(sentinels: SentinelSet, old_port: int) -> bool:
    return await primary_port(sentinels) != old_port


async def _relearned(stack: FaultStack) -> bool:
    state = await stack.state_hash()
    return state.get("phase") in {"idle", "draining"} and state.get("resident") == "judge"
