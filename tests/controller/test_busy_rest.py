"""A busy pool's supervisor rests between deadlines (docs/adr/0011): it reads the pool
when its first lease can expire, not every tick, and no grant or renewal wakes it; yet
an expired lease is reaped when it expires, not at the safety bound, and an acquire
that leaves a waiter wakes it at once. Real Redis, the real supervisor; the safety bound
(``idle_tick_interval``) is set far beyond what any check here waits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

import pytest
import redis.asyncio as aioredis
from nats.aio.client import Client as NatsClient
from prometheus_client import CollectorRegistry

from hotseat_common.audit_stream import AuditPublisher
from hotseat_common.config.model import PoolActivation
from hotseat_common.keys import Keys
from hotseat_common.messages import AcquireRequest, Granted, PlacementReason, RenewRequest
from hotseat_common.metrics import PoolMetrics
from hotseat_common.subjects import Subjects
from hotseat_pool_controller.decisions.placement import (
    GroupMember,
    GroupPolicy,
    decide_placement,
)
from hotseat_pool_controller.drivers import build_driver
from hotseat_pool_controller.model import PoolPolicy
from hotseat_pool_controller.runtime.announcer import Announcer
from hotseat_pool_controller.runtime.placement import CopyWriter
from hotseat_pool_controller.runtime.pool import PoolRuntime
from hotseat_pool_controller.store.group import GroupStore
from hotseat_pool_controller.store.link import RedisLink
from hotseat_pool_controller.store.pool import PoolStore, Renewal
from tests.support.pool_state import store_id
from tests.support.sim import sim_pool_config
from tests.support.waiting import eventually

MakeRuntime = Callable[[int], Awaitable[PoolRuntime]]

SAFETY_S = 600.0
"""The supervisor's safety bound: a check that waited for it would time out first."""


@pytest.fixture
async def make_runtime(
    nc: NatsClient, link: RedisLink, redis: aioredis.Redis, prefix: str
) -> AsyncIterator[MakeRuntime]:
    """A pool whose resident ``a`` is idle, and its supervisor running (tick 0.01 s)."""
    started: list[tuple[asyncio.Task[None], PoolRuntime]] = []
    config = sim_pool_config({"a": {}, "b": {}})
    pool = config.pools[0]
    driver = build_driver(config, pool)

    async def make(lease_ttl_ms: int) -> PoolRuntime:
        policy = replace(PoolPolicy.from_config(pool), lease_ttl_ms=lease_ttl_ms)
        store = PoolStore(link, Keys(prefix), policy)
        await redis.hset(
            Keys(prefix).pool_state("gpu0"),
            mapping={"phase": "idle", "resident": "a", "epoch": "1", "store": await store_id(link)},
        )
        metrics = PoolMetrics(CollectorRegistry())
        subjects = Subjects(prefix)
        announcer = Announcer(
            nc,
            subjects,
            AuditPublisher(nc, subjects, metrics.audit_publish),
            metrics,
            "c1",
        )
        runtime = PoolRuntime(pool, policy, store, driver, announcer, "c1")
        task = asyncio.create_task(runtime.supervise(0.01, SAFETY_S, SAFETY_S))
        started.append((task, runtime))
        await eventually(_resting(runtime))
        return runtime

    yield make
    for task, runtime in started:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await runtime.answers._store.reset()
    await driver.aclose()


def _resting(runtime: PoolRuntime) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return runtime.stir.resting_until is not None

    return check


def _ticked_since(runtime: PoolRuntime, before: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return runtime.ticks > before

    return check


def _ask(member: str, attempt: str) -> AcquireRequest:
    return AcquireRequest(
        pool="gpu0", member=member, attempt=attempt, request_id=attempt, router="r1", hold_s=30
    )


async def _grant(runtime: PoolRuntime, attempt: str) -> Granted:
    reply = await runtime.answers.acquire(_ask("a", attempt))
    assert isinstance(reply, Granted), reply
    return reply


async def test_steady_traffic_on_a_busy_pool_costs_no_tick(make_runtime: MakeRuntime) -> None:
    """200 requests (grant, renewal, release) beside a lease held throughout: the pool is
    busy the whole time and its supervisor, resting until that lease could expire (60 s),
    reads it not once; a busy pool ticked every 0.01 s before."""
    runtime = await make_runtime(60_000)
    quiet = runtime.ticks
    held = await _grant(runtime, "held")  # outlives the quiet pool's rest: it is read
    await eventually(_ticked_since(runtime, quiet))
    before = runtime.ticks
    for i in range(200):
        lease = await _grant(runtime, f"req-{i}")
        renewed = await runtime.answers.renew(
            RenewRequest(pool="gpu0", member="a", lease_id=lease.lease_id, epoch=lease.epoch)
        )
        assert renewed.outcome is Renewal.RENEWED
        assert await runtime.answers.release("a", lease.lease_id)
    assert runtime.ticks - before == 0, f"{runtime.ticks - before} ticks"
    # An acquire that leaves a waiter (b, behind a busy a) wakes it at once.
    await runtime.answers.acquire(_ask("b", "wants-b"))
    await eventually(_ticked_since(runtime, before))
    assert await runtime.answers.release("a", held.lease_id)


async def test_an_expired_lease_of_a_busy_pool_is_reaped_when_it_expires(
    make_runtime: MakeRuntime, redis: aioredis.Redis, prefix: str
) -> None:
    """Two leases of 1 s read by the supervisor; one is renewed (by another replica: no
    wake here), the other abandoned. The abandoned one is reaped once it expires, with the
    safety bound 600 s away: the supervisor rests until the first expiry, not past it."""
    runtime = await make_runtime(1_000)
    store = runtime.answers._store
    assert await store.grant_if_resident("a", "kept", "kept", "r2") is not None
    assert await store.grant_if_resident("a", "dropped", "dropped", "r2") is not None
    runtime.stir()  # another replica's state change: the supervisor reads both leases
    leases = Keys(prefix).pool_leases("gpu0", "a")
    for _ in range(200):  # renewals every 0.05 s, as the other replica answers them
        if await redis.zscore(leases, "dropped") is None:
            break
        renewed = await store.renew("a", "kept")
        assert renewed.outcome is Renewal.RENEWED
        await asyncio.sleep(0.05)  # the renewal cadence itself, not a wait for an event
    assert await redis.zscore(leases, "dropped") is None, "the expired lease was not reaped"
    assert await redis.zscore(leases, "kept") is not None


async def test_a_group_copy_behind_a_leased_resident_is_not_placeable_without_a_tick(
    make_runtime: MakeRuntime, link: RedisLink, prefix: str
) -> None:
    """gpu0 serves a group's copy ``b`` behind its idle resident ``a``: the group index
    shows it placeable. Each grant of ``a`` counts its lease in the index, so that an IfIdle
    placement finds the group busy at once, and its release uncounts it, so that ``b`` is
    placeable again: all without the resting supervisor reading the pool once."""
    runtime = await make_runtime(60_000)
    store = GroupStore(link, Keys(prefix), "bgroup")
    group = GroupPolicy("bgroup", 1, (GroupMember("gpu0", "b", "gpu0-b", 4),))
    runtime.serve_groups(CopyWriter([(store, "b")], 600_000, {}))
    runtime.stir()  # the supervisor writes gpu0's entry, then rests

    async def placed() -> tuple[str | None, PlacementReason]:
        p = decide_placement(
            group, await store.read(), mode=PoolActivation.IF_IDLE, stale_ms=600_000
        )
        return p.pool, p.reason

    cold = ("gpu0", PlacementReason.COLD_CHEAPEST_EVICTION)

    async def entry_written() -> bool:
        return runtime.stir.resting_until is not None and await placed() == cold

    await eventually(entry_written)
    quiet = runtime.ticks
    first = await _grant(runtime, "first")  # outlives the quiet pool's rest: it is read
    await eventually(_ticked_since(runtime, quiet))
    await eventually(_resting(runtime))
    assert await placed() == (None, PlacementReason.BUSY)
    assert await runtime.answers.release("a", first.lease_id)
    before = runtime.ticks
    for i in range(20):
        lease = await _grant(runtime, f"req-{i}")
        assert await placed() == (None, PlacementReason.BUSY), i
        renewed = await runtime.answers.renew(
            RenewRequest(pool="gpu0", member="a", lease_id=lease.lease_id, epoch=lease.epoch)
        )
        assert renewed.outcome is Renewal.RENEWED
        assert await placed() == (None, PlacementReason.BUSY), i
        assert await runtime.answers.release("a", lease.lease_id)
        assert await placed() == cold, i
    assert runtime.ticks == before, f"{runtime.ticks - before} ticks"
