"""The group index's take and join (docs/adr/0012) against a real Redis: the copy a
request goes to is chosen from the live counts and the request counted there in one
script, so that a burst of concurrent placements spreads over the warm copies (and
waits on loading copies) exactly as requests placed one after another do."""

from __future__ import annotations

import asyncio
from collections import Counter

from hotseat_common.keys import Keys
from hotseat_pool_controller.store.group import GroupStore
from hotseat_pool_controller.store.link import RedisLink

SLOTS = {"gpu0": 3, "gpu1": 3, "gpu2": 2, "gpu3": 4}
COPIES = list(SLOTS.items())


async def test_a_burst_of_takes_fills_every_copy_to_its_slots(link: RedisLink, prefix: str) -> None:
    """As many concurrent takes as the copies have slots: each copy gets exactly its
    slots; the next take with room finds none; without room it goes to the copy least
    over its slots. The reservations count in the read, and a grant's record replaces
    its reservation by the lease."""
    store = GroupStore(link, Keys(prefix), "assistant")
    burst = sum(SLOTS.values())
    taken = await asyncio.gather(*(
        store.take(f"a{i}", COPIES, room=True, prefer=None, reserve_ms=10_000)
        for i in range(burst)
    ))  # fmt: skip
    assert Counter(taken) == SLOTS
    assert await store.take("late", COPIES, room=True, prefer=None, reserve_ms=10_000) is None
    assert (await store.read()).leases == SLOTS
    over = await store.take("over", COPIES, room=False, prefer=None, reserve_ms=10_000)
    assert over == min(sorted(SLOTS), key=lambda p: Counter(taken)[p] - SLOTS[p])
    first, second = taken[0], taken[1]
    assert first is not None
    assert second is not None
    await store.record(first, "a0", lease_id="l0", ttl_ms=10_000, session=None, session_ttl_ms=0)
    leases = await link.execute("ZRANGE", store.keys.group_leases("assistant"), 0, -1)
    entries = {e.decode() if isinstance(e, bytes) else e for e in leases}
    assert f"{first} l0" in entries
    assert f"{first} ~a0" not in entries
    await store.record(second, "a1", lease_id=None, ttl_ms=0, session=None, session_ttl_ms=0)
    expected = Counter(taken) + Counter([over])
    expected[second] -= 1
    assert (await store.read()).leases == expected


async def test_a_take_prefers_the_session_copy_while_it_has_room(
    link: RedisLink, prefix: str
) -> None:
    store = GroupStore(link, Keys(prefix), "assistant")
    copies = [("gpu0", 1), ("gpu1", 1)]
    assert await store.take("a", copies, room=True, prefer="gpu1", reserve_ms=10_000) == "gpu1"
    assert await store.take("b", copies, room=True, prefer="gpu1", reserve_ms=10_000) == "gpu0"


async def test_a_burst_of_joins_puts_at_most_slots_waiters_on_each_loading_copy(
    link: RedisLink, prefix: str
) -> None:
    """Concurrent joins of two loading copies (2 and 3 slots): each gets exactly its
    slots of waiters, the next join finds none (so its placement is decided again and
    may claim another copy); the read counts the reservations as waiters, and a hold's
    record replaces its reservation by the waiter."""
    store = GroupStore(link, Keys(prefix), "assistant")
    loading = [("gpu0", 2), ("gpu1", 3)]
    joined = await asyncio.gather(*(
        store.join(f"a{i}", loading, reserve_ms=10_000) for i in range(5)
    ))  # fmt: skip
    assert Counter(joined) == {"gpu0": 2, "gpu1": 3}
    assert await store.join("late", loading, reserve_ms=10_000) is None
    assert (await store.read()).waiting == {"gpu0": 2, "gpu1": 3}
    first, second = joined[0], joined[1]
    assert first is not None
    assert second is not None
    await store.record(first, "a0", lease_id=None, ttl_ms=30_000, session=None, session_ttl_ms=0)
    waiting = await link.execute("ZRANGE", store.keys.group_waiting("assistant"), 0, -1)
    entries = {e.decode() if isinstance(e, bytes) else e for e in waiting}
    assert f"{first} a0" in entries
    assert f"{first} ~a0" not in entries
    assert (await store.read()).waiting == {"gpu0": 2, "gpu1": 3}
    # A join whose acquire answered nothing to count: its reservation ends.
    await store.record(second, "a1", lease_id=None, ttl_ms=0, session=None, session_ttl_ms=0)
    expected = Counter({"gpu0": 2, "gpu1": 3})
    expected[second] -= 1
    assert (await store.read()).waiting == expected
