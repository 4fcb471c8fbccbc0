"""A release wakes the supervisor only when it can move the pool: the last lease of a
member that other members' requests wait behind, or of one being drained; not one whose
only waiters are for the member itself (they are granted when they ask again)."""

from __future__ import annotations

import redis.asyncio as aioredis

from hotseat_common.keys import Keys
from hotseat_pool_controller.store.link import RedisLink
from hotseat_pool_controller.store.pool import PoolStore
from tests.controller.test_stray_waiters import POLICY
from tests.support.pool_state import store_id

FAR = 2**50  # a waiter deadline (ms) that never passes


async def test_release_wakes_only_for_other_members_waiters_or_a_drain(
    redis: aioredis.Redis, link: RedisLink, prefix: str
) -> None:
    keys = Keys(prefix)
    store = PoolStore(link, keys, POLICY)
    state = keys.pool_state("gpu0")
    await redis.hset(
        state,
        mapping={"phase": "idle", "resident": "judge", "epoch": "3", "store": await store_id(link)},
    )

    async def lease_then_release() -> bool:
        granted = await store.grant_if_resident("judge", "l1", "r1", "router")
        assert granted is not None
        released = await store.release("judge", "l1")
        assert released.removed
        return released.may_move

    assert not await lease_then_release()  # nobody waits
    await redis.zadd(keys.pool_waiters("gpu0", "judge"), {"late-judge": FAR})
    assert not await lease_then_release()  # only the resident's own waiters
    await redis.zadd(keys.pool_waiters("gpu0", "coder"), {"wants-coder": FAR})
    assert await lease_then_release()  # coder waits behind judge
    await redis.zrem(keys.pool_waiters("gpu0", "coder"), "wants-coder")
    await redis.hset(state, "phase", "draining")
    assert await lease_then_release()  # the last lease of a draining member
    await store.reset()
