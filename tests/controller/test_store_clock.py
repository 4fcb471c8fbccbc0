"""The store's clock: every script reads "now" from one place (scripts.NOW), Redis
``TIME`` in service, or the time a link's ``clock`` sends (the state machines' virtual
milliseconds); a failed swap's backoff is a deadline judged on that clock."""

from __future__ import annotations

import uuid

import redis.asyncio as aioredis

from hotseat.launcher import Managed
from hotseat_common.config.model import BusySignal
from hotseat_common.keys import Keys
from hotseat_common.settings import RedisSettings
from hotseat_pool_controller.model import Decision, Phase, PoolPolicy, SetFailure
from hotseat_pool_controller.store.group import GroupStore
from hotseat_pool_controller.store.link import RedisLink
from hotseat_pool_controller.store.pool import PoolStore
from tests.support.pool_state import store_id

POLICY = PoolPolicy(
    name="gpu",
    members=("a", "b"),
    max_waiters=4,
    lease_ttl_ms=3000,
    swap_timeout_ms=20_000,
    failure_backoff_ms=5000,
    busy_signal=BusySignal.LEASES,
    default=None,
)
T0 = 1_000_000_000


async def _redis_ms(client: aioredis.Redis) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def test_scripts_read_redis_time_unless_the_link_has_a_clock(
    redis_server: Managed, link: RedisLink
) -> None:
    """Without a clock the snapshot's now lies between two reads of Redis ``TIME``; with
    one, the pool's and the group's scripts read exactly its time, however far from
    Redis's it is."""
    client: aioredis.Redis = aioredis.from_url(redis_server.url, decode_responses=True)
    keys = Keys("k" + uuid.uuid4().hex[:8])
    now = [T0]
    clocked = RedisLink(RedisSettings(redis_url=redis_server.url), clock=lambda: now[0])
    try:
        before = await _redis_ms(client)
        served = (await PoolStore(link, keys, POLICY).snapshot()).now_ms
        assert before <= served <= await _redis_ms(client)

        assert (await PoolStore(clocked, keys, POLICY).snapshot()).now_ms == T0
        now[0] = T0 + 1234
        assert (await PoolStore(clocked, keys, POLICY).snapshot()).now_ms == T0 + 1234
        assert (await GroupStore(clocked, keys, "g").read()).now_ms == T0 + 1234
    finally:
        await clocked.aclose()
        await client.aclose()


async def test_a_failure_backoff_lapses_on_the_store_clock(redis_server: Managed) -> None:
    """A backoff set at T0 runs until T0 + backoff on the store's clock, whatever the wall
    clock does: the snapshot counts it down and the one-round-trip grant refuses the
    member until then, and grants it from then on."""
    now = [T0]
    link = RedisLink(RedisSettings(redis_url=redis_server.url), clock=lambda: now[0])
    store = PoolStore(link, Keys("k" + uuid.uuid4().hex[:8]), POLICY)
    try:
        await link.execute(
            "HSET",
            store.keys.pool_state("gpu"),
            *("phase", Phase.IDLE.value, "resident", "a", "epoch", "1"),
            *("store", await store_id(link)),
        )
        await store.apply(Decision(ops=(SetFailure("a", "boom", POLICY.failure_backoff_ms),)))
        now[0] = T0 + POLICY.failure_backoff_ms - 1
        assert (await store.snapshot()).failures == {"a": 1}
        assert await store.grant_if_resident("a", "L1", "q1", "r") is None
        now[0] = T0 + POLICY.failure_backoff_ms
        assert (await store.snapshot()).failures == {}
        assert await store.grant_if_resident("a", "L2", "q2", "r") is not None
    finally:
        await store.reset()
        await link.aclose()
