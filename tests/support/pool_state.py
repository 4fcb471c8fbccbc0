"""Writing a pool's state by hand in tests, as the controller's store would find it."""

from __future__ import annotations

from hotseat_pool_controller.store.link import RedisLink


async def store_id(link: RedisLink) -> str:
    """The ``run_id`` of the Redis server ``link`` talks to: what the store records in a
    state it wrote (a state without it, or with another, is taken as lost; ADR 0005)."""
    await link.execute("PING")
    return link.server_id
