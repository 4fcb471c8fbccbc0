"""The controller fails closed fast when its Redis stops answering (docs/reliability.md,
guarantee 5): a probe marks the store down within one interval plus its timeout, guarded
work is then refused at once, and work already waiting on the store is answered when the
probe fails instead of at the client's socket timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from hotseat.launcher import Managed
from hotseat_common.settings import RedisSettings
from hotseat_pool_controller.redis_link import RedisLink
from hotseat_pool_controller.store_health import StoreDown, StoreHealth
from tests.support.faultproxy import FaultProxy


@pytest.fixture
def proxy(redis_server: Managed) -> Iterator[FaultProxy]:
    with FaultProxy(int(redis_server.url.rsplit(":", 1)[1].split("/")[0])) as started:
        yield started


async def test_blackholed_store_is_refused_fast_and_recovers(proxy: FaultProxy) -> None:
    """Blackholed: a command waiting on the store is answered StoreDown within a probe
    interval plus timeout, later work is refused at once; healed: work runs again."""
    client = RedisLink(RedisSettings(redis_url=proxy.url("redis", "/0")), timeout=5)
    health = StoreHealth(client, interval=0.1, timeout=0.3)
    probe = asyncio.create_task(health.run())
    try:
        assert await health.guard(client.execute("PING"))
        proxy.blackhole()
        started = time.monotonic()
        with pytest.raises(StoreDown):
            await health.guard(client.execute("GET", "k"))
        assert time.monotonic() - started < 0.1 + 0.3 + 0.3
        started = time.monotonic()
        with pytest.raises(StoreDown):
            await health.guard(client.execute("GET", "k"))
        assert time.monotonic() - started < 0.05
        proxy.pass_()
        deadline = time.monotonic() + 10
        while not health.up:
            assert time.monotonic() < deadline, "the store never came back up"
            await asyncio.sleep(0.05)
        assert await health.guard(client.execute("PING"))
    finally:
        probe.cancel()
        await client.aclose()
