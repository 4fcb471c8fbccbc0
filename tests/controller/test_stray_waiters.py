"""A waiter left on the resident by a router that died while held does not block the pool:
the swap the decision takes (it ignores strays once the resident's grace is over) is also
accepted by the store, instead of every attempt failing its precondition until the
stray's deadline (found by the chaos soak, docs/reliability.md)."""

from __future__ import annotations

import redis.asyncio as aioredis

from hotseat_common.config.model import BusySignal
from hotseat_common.keys import Keys
from hotseat_pool_controller.decisions.tick import decide_tick
from hotseat_pool_controller.model import PoolPolicy
from hotseat_pool_controller.store.link import RedisLink
from hotseat_pool_controller.store.pool import PoolStore
from tests.support.pool_state import store_id

POLICY = PoolPolicy(
    name="gpu0",
    members=("judge", "coder"),
    max_waiters=100,
    lease_ttl_ms=5_000,
    swap_timeout_ms=60_000,
    failure_backoff_ms=5_000,
    busy_signal=BusySignal.LEASES,
    default=None,
    waiter_grace_ms=5_000,
)


async def test_a_stray_waiter_on_the_resident_does_not_block_a_swap(
    redis: aioredis.Redis, link: RedisLink, prefix: str
) -> None:
    """Resident judge committed a minute ago, a stray waiter for judge still live, coder
    demanded: the tick starts the swap to coder on its first attempt."""
    keys = Keys(prefix)
    store = PoolStore(link, keys, POLICY)
    seconds, micros = await redis.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    await redis.hset(
        keys.pool_state("gpu0"),
        mapping={
            "phase": "idle",
            "resident": "judge",
            "epoch": "5",
            "version": "3",
            "committed": str(now_ms - 60_000),
            "store": await store_id(link),
        },
    )
    await redis.zadd(keys.pool_waiters("gpu0", "judge"), {"stray": now_ms + 30_000})
    await redis.zadd(keys.pool_waiters("gpu0", "coder"), {"wants-coder": now_ms + 30_000})
    snap = await store.snapshot()
    decision = decide_tick(snap, POLICY, "c1")
    assert decision.swap is not None
    assert decision.swap.target == "coder"
    applied = await store.apply(decision)
    assert applied.name == "OK"
    assert (await store.snapshot()).phase == "unloading"
