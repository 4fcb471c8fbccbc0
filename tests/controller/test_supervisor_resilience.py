"""A supervisor tick that loses every race under contention is retried on the next tick:
it never takes the controller down (found by the chaos soak, docs/reliability.md)."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NatsClient
from prometheus_client import CollectorRegistry

from hotseat_common.audit_stream import AuditPublisher
from hotseat_common.keys import Keys
from hotseat_common.metrics import PoolMetrics
from hotseat_common.subjects import Subjects
from hotseat_pool_controller.drivers import build_driver
from hotseat_pool_controller.model import PoolPolicy
from hotseat_pool_controller.runtime.announcer import Announcer
from hotseat_pool_controller.runtime.pool import PoolRuntime
from hotseat_pool_controller.store.link import RedisLink
from hotseat_pool_controller.store.pool import ConflictError, PoolStore
from tests.support.sim import sim_pool_config


async def test_a_contended_tick_does_not_end_the_supervisor(
    nc: NatsClient, link: RedisLink, prefix: str
) -> None:
    """The first tick raises ConflictError (every attempt lost a race); the supervisor
    logs it and ticks again instead of dying."""
    config = sim_pool_config({"a": {}, "b": {}})
    pool = config.pools[0]
    policy = PoolPolicy.from_config(pool)
    metrics = PoolMetrics(CollectorRegistry())
    subjects = Subjects(prefix)
    publisher = AuditPublisher(nc, subjects, metrics.audit_publish)
    driver = build_driver(config, pool)
    runtime = PoolRuntime(
        pool,
        policy,
        PoolStore(link, Keys(prefix), policy),
        driver,
        Announcer(nc, subjects, publisher, metrics, "c1"),
        "c1",
    )
    ticks = 0
    again = asyncio.Event()

    async def contended_tick(*, reap: bool = True) -> None:
        nonlocal ticks
        ticks += 1
        if ticks == 1:
            raise ConflictError("pool gpu0: decision lost 50 races")
        again.set()

    runtime.tick = contended_tick  # type: ignore[method-assign]
    supervisor = asyncio.create_task(runtime.supervise(0.01, 60))
    try:
        await asyncio.wait_for(again.wait(), 5)
        assert not supervisor.done()
    finally:
        supervisor.cancel()
        await asyncio.gather(supervisor, return_exceptions=True)
        await driver.aclose()
