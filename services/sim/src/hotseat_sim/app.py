"""The sim's ASGI app: OpenAI, llama.cpp, control and debug endpoints plus the shared ops
endpoints, with a lifespan that owns the Redis ledger and the model state."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hotseat_common.connections import connect_redis
from hotseat_common.keys import Keys
from hotseat_common.logging import get_logger
from hotseat_common.service import Readiness, ops_router
from hotseat_sim import control, debug, llama_api, openai_api
from hotseat_sim.ledger import Ledger
from hotseat_sim.model_state import ModelState
from hotseat_sim.profile import SimProfile
from hotseat_sim.runtime import ARRIVED_AT, SimRuntime
from hotseat_sim.settings import SimSettings
from hotseat_sim.slots import SlotPool

log = get_logger(__name__)

MEMBER_HEADER = "x-sim-member"
BACKEND_HEADER = "x-sim-backend"


class SimHeaders:
    """Adds ``x-sim-member`` and ``x-sim-backend`` to every response, errors included."""

    def __init__(self, app: ASGIApp, profile: SimProfile) -> None:
        self.app = app
        self.extra = [
            (MEMBER_HEADER.encode(), profile.member.encode()),
            (BACKEND_HEADER.encode(), profile.backend.encode()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)


class ArrivalStamp:
    """Stamps each HTTP request with the time its head reached the app (``ARRIVED_AT``),
    before the framework routes it or reads its body: the request log's ``time``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})[ARRIVED_AT] = time.time()
        await self.app(scope, receive, send)


def create_app(settings: SimSettings, profile: SimProfile) -> FastAPI:
    """The app for ``profile``; nothing connects until the lifespan starts."""
    registry = CollectorRegistry()
    readiness = Readiness()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[dict[str, Any]]:
        async with AsyncExitStack() as stack:
            ledger: Ledger | None = None
            if profile.gpu is not None:
                redis = connect_redis(settings)
                stack.push_async_callback(redis.aclose)
                ledger = await stack.enter_async_context(
                    Ledger(
                        redis,
                        Keys(settings.key_prefix),
                        profile.gpu,
                        profile.member,
                        max_entries=settings.ledger_max_entries,
                    )
                )
            if profile.slot_dir is not None:  # llama-server wants its --slot-save-path to exist
                profile.slot_dir.mkdir(parents=True, exist_ok=True)
            model = ModelState(profile, ledger)
            stack.push_async_callback(model.shutdown)
            await model.forget_stale_residency()
            if settings.loaded:
                await model.load(instant=True)
            elif settings.load_on_start:
                await model.load()
            sim = SimRuntime(profile=profile, model=model, slots=SlotPool(profile.sim.slots))
            log.info(
                "sim_started",
                backend=profile.backend,
                pool=profile.pool,
                member=profile.member,
                state=model.phase.value,
            )
            try:
                yield {"sim": sim}
            finally:
                readiness.shutting_down = True
                log.info("sim_stopping", member=profile.member, in_flight=model.in_flight)

    app = FastAPI(title="hotseat-sim", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.include_router(ops_router(readiness, registry))
    app.include_router(openai_api.router)
    app.include_router(llama_api.router)
    app.include_router(control.router)
    app.include_router(debug.router)
    app.add_middleware(SimHeaders, profile=profile)
    app.add_middleware(ArrivalStamp)  # the outermost of ours: added last
    return app
