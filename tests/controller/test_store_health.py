"""The controller fails closed fast when its Redis stops answering (docs/reliability.md,
guarantee 5): a probe marks the store down within one interval plus its timeout, guarded
work is then refused at once, and work already waiting on the store is answered when the
probe fails instead of at the client's socket timeout."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from hotseat.launcher import Managed
from hotseat_common.settings import RedisSettings
from hotseat_pool_controller.store.health import StoreDown, StoreHealth
from hotseat_pool_controller.store.link import RedisLink
from tests.support.faultproxy import FaultProxy
from tests.support.waiting import eventually


@pytest.fixture
def proxy(redis_server: Managed) -> Iterator[FaultProxy]:
    with FaultProxy(int(redis_server.url.rsplit(":", 1)[1].split("/")[0])) as started:
        yield started


async def test_blackholed_store_is_refused_fast_and_recovers(proxy: FaultProxy) -> None:
    """Blackholed: a command waiting on the store is answered StoreDown by the probe that
    failed (not by the client's own socket timeout), later work is refused without being
    sent; healed: work runs again."""
    # The client would wait 60 s for an answer: only the probe can answer within the test.
    client = RedisLink(RedisSettings(redis_url=proxy.url("redis", "/0")), timeout=60)
    health = StoreHealth(client, interval=0.1, timeout=0.3)
    probe = asyncio.create_task(health.run())
    try:
        assert await health.guard(client.execute("PING"))
        proxy.blackhole()
        assert health.up  # no await since the blackhole: the command below finds it up
        with pytest.raises(StoreDown, match="stopped answering") as waited:
            await health.guard(client.execute("GET", "k"))
        assert not health.up, waited.value  # cut loose by the failed probe
        started: list[str] = []

        async def later() -> bytes:
            started.append("GET")
            return await client.execute("GET", "k")  # type: ignore[no-any-return]

        with pytest.raises(StoreDown, match="unreachable"):
            await health.guard(later())
        assert started == []  # refused before it was sent, not after a wait
        proxy.pass_()
        await eventually(lambda: _up(health), timeout=30, interval=0.05)
        assert await health.guard(client.execute("PING"))
    finally:
        probe.cancel()
        await client.aclose()


async def _up(health: StoreHealth) -> bool:
    return health.up
