"""Redis as production runs it: the controllers reach the pool store through Redis
Sentinel, and the primary fails over mid-traffic (docs/reliability.md guarantee 26).

A primary, a replica and a Sentinel, all real redis-server processes on this machine;
the sims keep their ledger on the session's Redis, so the verdict sees the truth."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from hotseat.launcher import Managed, find_binary, free_port, spawn, start_redis, wait_for_marker
from hotseat_common.keys import Keys
from tests.fault.conftest import MakeFaultStack
from tests.support.clients import StreamResult, chat, live_stream
from tests.support.diagnosis import explained
from tests.support.faultstack import FaultStack
from tests.support.procs import frozen, kill
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
async def sentinel_set(tmp_path: Path) -> AsyncIterator[SentinelSet]:
    """A primary, its replica in sync, and a Sentinel that can promote that replica.

    Sentinel finds replicas in the primary's ``INFO``, which it reads when it starts
    monitoring and then every 10 s; a failover before it found the replica aborts
    (``-failover-abort-no-good-slave``) and is not tried again for twice the failover
    timeout. So the Sentinel starts once the replica is in sync, and the set is ready once
    the Sentinel lists the replica as reachable."""
    primary = start_redis(tmp_path / "primary")
    procs = [primary]
    try:
        port = _port(primary)
        replica = start_redis(
            tmp_path / "replica", extra_args=["--replicaof", "127.0.0.1", str(port)]
        )
        procs.append(replica)
        await eventually(lambda: replica_in_sync(replica), timeout=15)
        sentinel, sentinel_port = start_sentinel(tmp_path / "sentinel", port)
        procs.append(sentinel)
        found = SentinelSet(primary, replica, sentinel, sentinel_port)
        await eventually(lambda: replica_known(found), timeout=30, interval=0.1)
        yield found
    finally:
        for proc in procs:
            proc.stop(5)


def _port(redis: Managed) -> int:
    return int(redis.url.rsplit(":", 1)[1].split("/")[0])


async def primary_port(sentinels: SentinelSet) -> int:
    client: aioredis.Redis = aioredis.from_url(sentinels.sentinel.url, decode_responses=True)
    try:
        _host, port = await client.execute_command(
            "SENTINEL", "get-master-addr-by-name", MASTER_NAME
        )
        return int(port)
    finally:
        await client.aclose()


async def replica_known(sentinels: SentinelSet) -> bool:
    """The Sentinel lists the replica, reached (no ``disconnected`` or ``s_down`` flag)
    and linked to its primary: a replica it can promote."""
    client: aioredis.Redis = aioredis.from_url(sentinels.sentinel.url, decode_responses=True)
    try:
        replicas = await client.execute_command("SENTINEL", "replicas", MASTER_NAME)
    finally:
        await client.aclose()
    for entry in replicas:
        fields = (
            entry if isinstance(entry, dict) else dict(zip(entry[::2], entry[1::2], strict=True))
        )
        if fields.get("flags") == "slave" and fields.get("master-link-status") == "ok":
            return True
    return False


async def replica_in_sync(replica: Managed) -> bool:
    client: aioredis.Redis = aioredis.from_url(replica.url, decode_responses=True)
    try:
        info = await client.info("replication")
        return info.get("master_link_status") == "up"
    finally:
        await client.aclose()


def sentinel_stack(make_stack: MakeFaultStack, sentinels: SentinelSet) -> FaultStack:
    """Sims, two controllers that reach the pool store through the Sentinel, a router;
    judge resident once :meth:`FaultStack.wait_resident` says so."""
    stack: FaultStack = make_stack(
        pool_stack_config(pool={"leaseTtl": "6s"}),
        extra_env={
            "HOTSEAT_REDIS_SENTINELS": sentinels.sentinels,
            "HOTSEAT_REDIS_SENTINEL_MASTER": MASTER_NAME,
        },
    )
    stack.controller_redis_url = sentinels.primary.url  # scheme and database only
    stack.start_sims()
    stack.start_controller("c1")
    stack.start_controller("c2")
    stack.start_router()
    return stack


async def test_the_primary_fails_over_mid_stream_and_the_contract_holds(
    make_stack: MakeFaultStack, sentinel_set: SentinelSet
) -> None:
    """Controllers on Sentinel; the primary is SIGKILLed under a stream on judge and the
    replica is promoted: the controllers follow the failover, treat the promoted server as
    one that may have lost writes (the resident is busy while routers renew their leases
    back), the stream runs to its end, and a Wait request for coder sent after the
    failover is served once the stream has ended; nothing overlaps and nothing is cut."""
    stack = sentinel_stack(make_stack, sentinel_set)
    async with explained(stack):  # one failure says what happened: verdict, audit, logs
        await stack.wait_resident("judge", timeout=30)
        async with live_stream(stack.routers[0].url, "judge", max_tokens=200) as stream:  # 10 s
            held = await _fail_over(stack, sentinel_set)
            result = await stream
        await _contract_held(stack, result, await held)


async def test_a_failover_that_lost_the_streams_lease_does_not_cut_it(
    make_stack: MakeFaultStack, sentinel_set: SentinelSet
) -> None:
    """The write a failover loses (replication is asynchronous): the stream's lease, just
    granted on the primary, is not on the replica (the test removes it there, as if it
    had not arrived yet), then the primary is SIGKILLed and the replica promoted. The
    controllers rebuild the pool there and count judge busy while they relearn; the
    router's next renewal writes the lease back (adopted); a Wait request for coder waits
    for the stream, which runs to its end; nothing is cut."""
    stack = sentinel_stack(make_stack, sentinel_set)
    async with explained(stack):
        await stack.wait_resident("judge", timeout=30)
        async with live_stream(stack.routers[0].url, "judge", max_tokens=200) as stream:
            lost = await _lose_the_leases(stack, sentinel_set.replica, "judge")
            assert lost, "the stream's lease was on the replica"
            held = await _fail_over(stack, sentinel_set)
            adopted = await eventually(lambda: stack.lease_expiries("judge"), timeout=30)
            result = await stream
        await _contract_held(stack, result, await held)
        assert set(adopted) == set(lost), "the router's renewal wrote the lost lease back"


async def test_a_failover_while_the_resident_does_not_answer_keeps_it_resident(
    make_stack: MakeFaultStack, sentinel_set: SentinelSet
) -> None:
    """judge stops answering (SIGSTOP) under a stream, and the primary fails over: the
    controllers rebuild the pool without being able to read judge's state. A member that
    does not answer may hold the GPU and serve under its streams: the rebuilt state names
    judge the resident (unhealthy), never takes it for gone and never swaps it (loading
    judge again, and unloading it when that load times out, would cut the stream once
    judge answers). Once it answers, the stream runs to its end and a Wait request for
    coder is served after it; nothing is cut."""
    stack = sentinel_stack(make_stack, sentinel_set)
    async with explained(stack):
        await stack.wait_resident("judge", timeout=30)
        # 20 s of tokens, plus the freeze: the stream outlasts the rebuild.
        async with live_stream(stack.routers[0].url, "judge", max_tokens=400) as stream:
            with frozen(stack.sims["judge"]):
                first = await primary_port(sentinel_set)
                kill(sentinel_set.primary)
                await eventually(lambda: _promoted(sentinel_set, first), timeout=30, interval=0.1)
                stack.controller_redis_url = sentinel_set.replica.url
                rebuilt = await eventually(
                    lambda: _state_on(stack, sentinel_set.replica), timeout=60, interval=0.05
                )
                assert rebuilt.get("resident") == "judge", rebuilt
                assert rebuilt.get("unhealthy"), rebuilt
            await eventually(lambda: _controllers_ready(stack), timeout=30, interval=0.05)
            held = asyncio.create_task(chat(stack.routers[0].url, "coder", timeout=90))
            result = await stream
        await _contract_held(stack, result, await held)


async def _fail_over(stack: FaultStack, sentinels: SentinelSet) -> asyncio.Task[httpx.Response]:
    """SIGKILL the primary, wait until the replica is promoted, a controller rebuilt the
    pool on it with judge resident (the controllers did not take the state it replicated
    for their own) and they serve again; then send a Wait request for coder (returned,
    still held)."""
    first = await primary_port(sentinels)
    kill(sentinels.primary)
    await eventually(lambda: _promoted(sentinels, first), timeout=30, interval=0.1)
    stack.controller_redis_url = sentinels.replica.url  # where the tests read state
    await eventually(lambda: _rebuilt_on(stack, sentinels.replica), timeout=30, interval=0.05)
    # A controller fails closed until its store probe has seen the new primary.
    await eventually(lambda: _controllers_ready(stack), timeout=30, interval=0.05)
    return asyncio.create_task(chat(stack.routers[0].url, "coder", timeout=90))


async def _contract_held(stack: FaultStack, result: StreamResult, answer: httpx.Response) -> None:
    """Nothing overlapped, nothing was cut: the stream ended cleanly, and the held
    request was served by coder."""
    await stack.assert_invariants()
    assert result.clean, result
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-hotseat-backend"] == "coder"


async def _lose_the_leases(stack: FaultStack, replica: Managed, member: str) -> list[str]:
    """Remove ``member``'s leases from ``replica`` alone (made writable for it: the
    primary still has them), as a failover loses writes that had not reached the replica
    yet: the lease, its record and its attempt's entry. Returns the leases removed."""
    keys = Keys(stack.prefix)
    client: aioredis.Redis = aioredis.from_url(replica.url, decode_responses=True)
    try:
        await client.config_set("replica-read-only", "no")
        leases: list[str] = await client.zrange(keys.pool_leases("gpu0", member), 0, -1)
        attempts = await client.hgetall(keys.pool_attempt_leases("gpu0"))
        async with client.pipeline(transaction=True) as pipe:
            pipe.delete(keys.pool_leases("gpu0", member))
            for lease in leases:
                pipe.hdel(keys.pool_lease_meta("gpu0"), lease)
            for attempt, lease in attempts.items():
                if lease in leases:
                    pipe.hdel(keys.pool_attempt_leases("gpu0"), attempt)
            await pipe.execute()
        await client.config_set("replica-read-only", "yes")
        return leases
    finally:
        await client.aclose()


async def _controllers_ready(stack: FaultStack) -> bool:
    async with httpx.AsyncClient(timeout=2) as client:
        for controller in stack.controllers.values():
            if (await client.get(f"{controller.url}/readyz")).status_code != 200:
                return False
    return True


async def _promoted(sentinels: SentinelSet, old_port: int) -> bool:
    return await primary_port(sentinels) != old_port


async def _state_on(stack: FaultStack, redis: Managed) -> dict[str, str]:
    """The pool state once a controller rebuilt it on ``redis`` (its ``store`` names that
    server: the state ``redis`` only replicated from the old primary does not count)."""
    client: aioredis.Redis = aioredis.from_url(redis.url, decode_responses=True)
    try:
        run_id = (await client.info("server"))["run_id"]
    finally:
        await client.aclose()
    state = await stack.state_hash()
    return state if state.get("store") == run_id else {}


async def _rebuilt_on(stack: FaultStack, redis: Managed) -> bool:
    """judge resident and serving in a state a controller rebuilt on ``redis``."""
    state = await _state_on(stack, redis)
    return state.get("phase") in {"idle", "draining"} and state.get("resident") == "judge"
