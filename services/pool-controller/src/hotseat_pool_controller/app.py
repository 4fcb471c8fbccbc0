"""The controller process: its lifespan owns Redis, NATS, drivers and background loops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry

from hotseat_common.api_docs import serve_api_docs
from hotseat_common.audit_stream import AuditPublisher, AuditStreamSpec, ensure_audit_stream
from hotseat_common.config.model import HotseatConfig
from hotseat_common.connections import connect_nats
from hotseat_common.keys import Keys
from hotseat_common.logging import get_logger
from hotseat_common.messages import PoolStateChanged
from hotseat_common.metrics import PoolMetrics
from hotseat_common.service import Readiness, ops_router
from hotseat_common.subjects import Subjects
from hotseat_common.tracing import Tracing, start_tracing
from hotseat_pool_controller.admin import admin_router
from hotseat_pool_controller.console import Console
from hotseat_pool_controller.drivers import build_driver
from hotseat_pool_controller.handlers import ActivationHandlers
from hotseat_pool_controller.model import PoolPolicy
from hotseat_pool_controller.runtime.announcer import Announcer
from hotseat_pool_controller.runtime.answers import PoolAnswers
from hotseat_pool_controller.runtime.placement import (
    CopyWriter,
    GroupPlacer,
    Residency,
    build_placement,
)
from hotseat_pool_controller.runtime.pool import PoolRuntime
from hotseat_pool_controller.settings import ControllerSettings
from hotseat_pool_controller.store.health import StoreHealth
from hotseat_pool_controller.store.link import RedisLink
from hotseat_pool_controller.store.pool import PoolStore

log = get_logger(__name__)

STALE_TICKS = 3
"""A group index entry no replica refreshed for this many idle tick intervals is a lost
pool's (docs/adr/0012): quiet pools refresh theirs every interval."""


def create_app(settings: ControllerSettings, config: HotseatConfig) -> FastAPI:  # noqa: PLR0915 - the lifespan wires every part, once
    registry = CollectorRegistry()
    readiness = Readiness()
    pools: dict[str, PoolRuntime] = {}
    answers: dict[str, PoolAnswers] = {}
    groups: dict[str, GroupPlacer] = {}
    controller = settings.instance_name()
    console = Console(
        answers,
        interval=settings.pool_updates_interval,
        audit_url=settings.audit_url,
        groups=groups,
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            tracing = _tracing(settings, controller, stack)
            # Every store script is safe to send twice (preconditions, idempotent writes),
            # so a command that met a connection broken by a Redis restart is resent.
            redis = RedisLink(settings, retries=2, name=controller)
            stack.push_async_callback(redis.aclose)
            await redis.execute("PING")
            nc = await connect_nats(settings, name=controller)
            stack.push_async_callback(nc.drain)
            subjects = Subjects(settings.subject_prefix)
            js = nc.jetstream()
            await ensure_audit_stream(js, AuditStreamSpec(settings.audit_stream, subjects))
            metrics = PoolMetrics(registry)
            audit = AuditPublisher(nc, subjects, metrics.audit_publish)
            audit.start()
            stack.push_async_callback(audit.close, settings.shutdown_grace)
            announcer = Announcer(nc, subjects, audit, metrics, controller)
            for runtime in _runtimes(settings, config, redis, announcer, stack, tracing=tracing):
                pools[runtime.name] = runtime
                answers[runtime.name] = runtime.answers
            placers, serves = build_placement(
                config,
                redis,
                Keys(settings.key_prefix),
                answers,
                stale_ms=round(STALE_TICKS * settings.idle_tick_interval * 1000),
            )
            groups.update(placers)
            residency: Residency = {}
            for runtime in pools.values():
                if runtime.name in serves:
                    runtime.serve_groups(
                        CopyWriter(
                            serves[runtime.name],
                            round(settings.idle_tick_interval * 1000),
                            residency,
                        )
                    )
            health = StoreHealth(
                redis,
                interval=settings.store_probe_interval,
                timeout=settings.store_probe_timeout,
            )
            handlers = ActivationHandlers(
                nc,
                subjects,
                answers,
                settings.max_concurrent_requests,
                health,
                tracing=tracing,
                placers=placers,
            )
            await handlers.start()
            await _wake_on_state_changes(nc, subjects, pools)
            loops = [
                asyncio.create_task(
                    p.supervise(
                        settings.tick_interval,
                        settings.reconcile_interval,
                        settings.idle_tick_interval,
                    ),
                    name=f"supervise-{p.name}",
                )
                for p in pools.values()
            ]
            loops.append(asyncio.create_task(health.run(), name="store-health"))
            loops.append(await console.start(nc, subjects, stack))
            for task in loops:
                task.add_done_callback(_die_loudly)
            readiness.add("nats", lambda: nc.is_connected)
            readiness.add("store", lambda: health.up)
            log.info("controller_started", controller=controller, pools=list(pools))
            try:
                yield
            finally:
                readiness.shutting_down = True
                console.feed.close()
                await handlers.stop(settings.shutdown_grace)
                for task in loops:
                    task.cancel()
                swaps = [t for p in pools.values() for t in p.swaps.tasks]
                if swaps:
                    # A swap outlives us only through its heartbeat: another replica takes
                    # it over from the unload step after the heartbeat lapses.
                    _, unfinished = await asyncio.wait(swaps, timeout=settings.shutdown_grace)
                    for task in unfinished:
                        task.cancel()
                for task in [*loops, *swaps]:
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
                log.info(
                    "controller_stopped",
                    controller=controller,
                    swaps_interrupted=sum(1 for t in swaps if t.cancelled()),
                )

    app = FastAPI(title="Hotseat pool controller", lifespan=lifespan, docs_url=None, redoc_url=None)
    _routes(app, settings, readiness, registry, answers=answers, console=console)
    return app


def _routes(
    app: FastAPI,
    settings: ControllerSettings,
    readiness: Readiness,
    registry: CollectorRegistry,
    *,
    answers: dict[str, PoolAnswers],
    console: Console,
) -> None:
    serve_api_docs(app)
    app.include_router(ops_router(readiness, registry))
    app.include_router(admin_router(answers, settings.admin_token, console.groups))
    token = settings.admin_token
    console.mount(app, admin=token is not None and bool(token.get_secret_value().strip()))


def _runtimes(
    settings: ControllerSettings,
    config: HotseatConfig,
    redis: RedisLink,
    announcer: Announcer,
    stack: AsyncExitStack,
    *,
    tracing: Tracing,
) -> list[PoolRuntime]:
    """One runtime per configured pool, each with its store and its driver (closed by
    ``stack``)."""
    keys = Keys(settings.key_prefix)
    runtimes = []
    for pool in config.pools:
        policy = PoolPolicy.from_config(pool, heartbeat_ttl_s=settings.heartbeat_ttl)
        driver = build_driver(config, pool)
        stack.push_async_callback(driver.aclose)
        store = PoolStore(redis, keys, policy)
        runtimes.append(
            PoolRuntime(
                pool, policy, store, driver, announcer, announcer.controller, tracing=tracing
            )
        )
    return runtimes


def _tracing(settings: ControllerSettings, controller: str, stack: AsyncExitStack) -> Tracing:
    """Traces if asked for (docs/adr/0010); what is buffered is exported at shutdown."""
    tracing = start_tracing("controller", controller, settings.otlp_endpoint)
    stack.push_async_callback(asyncio.to_thread, tracing.shutdown)
    return tracing


def _die_loudly(task: asyncio.Task[None]) -> None:
    """A supervisor loop must never end: if one does, the process goes down visibly."""
    if task.cancelled():
        return
    exc = task.exception()
    log.critical("supervisor_loop_died", task=task.get_name(), error=repr(exc))
    import os  # noqa: PLC0415 - only on the fatal path
    import signal  # noqa: PLC0415

    os.kill(os.getpid(), signal.SIGTERM)


async def _wake_on_state_changes(
    nc: NatsClient, subjects: Subjects, pools: dict[str, PoolRuntime]
) -> None:
    """A state change any replica announces wakes this replica's supervisor of the pool,
    if it is quiet (a swap another replica started is this one's to take over if its
    owner goes silent)."""

    async def on_change(msg: Msg) -> None:
        try:
            changed = PoolStateChanged.from_bytes(msg.data)
        except ValueError:
            return
        runtime = pools.get(changed.pool)
        if runtime is not None:
            runtime.stir()

    await nc.subscribe(subjects.pool_events_all, cb=on_change)
