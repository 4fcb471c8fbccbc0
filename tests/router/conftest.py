"""Router test harness: fake upstreams on free ports, a real router (uvicorn on a free
port, in this process, with the router's own connection layer) and the audit events it
publishes, read back from JetStream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from nats.aio.client import Client as NatsClient

import hotseat_router
from hotseat.launcher import Managed, free_port
from hotseat_common.config import HotseatConfig, parse_config
from hotseat_common.service import uvicorn_options
from hotseat_common.settings import ServiceSettings
from hotseat_router.app import ActivationFactory, RouterApp, create_app
from hotseat_router.connection import LimitedHttpProtocol
from hotseat_router.settings import RouterSettings, connection_limits
from tests.router.upstreams import FakeUpstream
from tests.support.audit_trail import urls_flushed


@dataclass
class RunningRouter:
    url: str
    app: RouterApp
    server: uvicorn.Server
    task: asyncio.Task[None]

    async def stop(self) -> None:
        """Graceful stop: the lifespan flushes audit events before this returns."""
        if not self.task.done():
            self.server.should_exit = True
            await asyncio.wait_for(self.task, 15)


@pytest.fixture
async def upstream() -> AsyncIterator[Callable[[str], Awaitable[FakeUpstream]]]:
    started: list[FakeUpstream] = []

    async def start(name: str) -> FakeUpstream:
        fake = FakeUpstream(name=name)
        await fake.start()
        started.append(fake)
        return fake

    yield start
    for fake in started:
        await fake.stop()


def settings_for(default_nats: str, prefix: str, **overrides: Any) -> RouterSettings:
    values: dict[str, Any] = {
        "nats_url": default_nats,
        "subject_prefix": prefix,
        "audit_stream": f"{prefix}_AUDIT",
        "port": free_port(),
        "instance": f"router-{prefix}",
        "shutdown_grace": 5,
    }
    return RouterSettings(**{**values, **overrides})


async def serve(
    app: Any, settings: ServiceSettings, *, http: Any, lifespan: str
) -> tuple[uvicorn.Server, asyncio.Task[None]]:
    """Serve ``app`` with uvicorn in this event loop, configured as a service's process
    does (:func:`~hotseat_common.service.uvicorn_options`); returns once it listens."""
    options = {**uvicorn_options(settings, http=http), "host": "127.0.0.1", "lifespan": lifespan}
    server = uvicorn.Server(uvicorn.Config(app, **options))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("the server exited during start-up")
        await asyncio.sleep(0.01)  # uvicorn's Server offers a flag, no event, for started
    return server, task


ROUTER_CODE = str(Path(hotseat_router.__file__).parent)


@contextlib.contextmanager
def router_tasks() -> Iterator[list[str]]:
    """The tasks started meanwhile in this event loop (the in-process router's) whose
    coroutine is the router's own code, by qualified name."""
    loop = asyncio.get_running_loop()
    before = loop.get_task_factory()
    started: list[str] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        code = getattr(coro, "cr_code", None)
        if code is not None and code.co_filename.startswith(ROUTER_CODE):
            started.append(code.co_qualname)
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)
    try:
        yield started
    finally:
        loop.set_task_factory(before)


@pytest.fixture
def running() -> list[RunningRouter]:
    """The routers this test started (the audit reader waits for them to flush)."""
    return []


@pytest.fixture
async def start_router(
    nats_server: Managed, prefix: str, running: list[RunningRouter]
) -> AsyncIterator[Callable[..., Awaitable[RunningRouter]]]:

    async def start(
        config: dict[str, Any] | HotseatConfig,
        *,
        activation_factory: ActivationFactory | None = None,
        health_clock: Callable[[], float] | None = None,
        http: Any = None,
        **overrides: Any,
    ) -> RunningRouter:
        """``http``: uvicorn's protocol instead of the router's own connection layer."""
        parsed = config if isinstance(config, HotseatConfig) else parse_config(config)
        settings = settings_for(nats_server.url, prefix, **overrides)
        kwargs: dict[str, Any] = {}
        if activation_factory:
            kwargs["activation_factory"] = activation_factory
        if health_clock:
            kwargs["health_clock"] = health_clock
        app = create_app(settings, parsed, **kwargs)
        server, task = await serve(
            app,
            settings,
            http=http or partial(LimitedHttpProtocol, limits=connection_limits(settings)),
            lifespan="on",
        )
        router = RunningRouter(f"http://127.0.0.1:{settings.port}", app, server, task)
        running.append(router)
        return router

    yield start
    for router in running:
        with contextlib.suppress(Exception):
            await router.stop()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as http:
        yield http


class AuditReader:
    """Reads the audit events of one test's stream, in publish order."""

    def __init__(self, nc: NatsClient, stream: str, routers: list[RunningRouter]) -> None:
        self._js = nc.jetstream()
        self._stream = stream
        self._routers = routers
        self._sub: Any = None
        self.events: list[dict[str, Any]] = []

    async def _pull(self, timeout: float) -> None:
        if self._sub is None:
            self._sub = await self._js.pull_subscribe(">", durable=None, stream=self._stream)
        with contextlib.suppress(TimeoutError):
            for msg in await self._sub.fetch(100, timeout=timeout):
                self.events.append(orjson.loads(msg.data))
                await msg.ack()

    async def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], *, count: int = 1, timeout: float = 5
    ) -> list[dict[str, Any]]:
        """Events matching ``predicate`` once at least ``count`` of them have arrived."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            found = [e for e in self.events if predicate(e)]
            if len(found) >= count:
                return found
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise AssertionError(f"only {len(found)} of {count} events: {self.events}")
            await self._pull(min(left, 0.5))

    async def request_event(self, request_id: str) -> dict[str, Any]:
        """The one request event of ``request_id`` (its router must still be running)."""
        await self.wait_for(lambda e: e["kind"] == "request" and e.get("request_id") == request_id)
        (event,) = [
            e
            for e in await self.settled()
            if e["kind"] == "request" and e.get("request_id") == request_id
        ]
        return event

    async def all_events(self) -> list[dict[str, Any]]:
        """Every event in the stream now (call after the router flushed and stopped)."""
        info = await self._js.stream_info(self._stream)
        await self.wait_for(lambda _e: True, count=info.state.messages)
        return self.events

    async def settled(self) -> list[dict[str, Any]]:
        """Every event, once each running router of the test has flushed its buffer."""
        await urls_flushed(r.url for r in self._routers if not r.task.done())
        return await self.all_events()


@pytest.fixture
async def audit(nc: NatsClient, prefix: str, running: list[RunningRouter]) -> AuditReader:
    return AuditReader(nc, f"{prefix}_AUDIT", running)
