"""What every Hotseat service shares: ``/healthz``, ``/readyz``, ``/metrics`` and running
an ASGI app under uvicorn with a graceful SIGTERM."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvicorn
from fastapi import APIRouter, FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from hotseat_common.settings import ServiceSettings


@dataclass
class Readiness:
    """Named readiness checks; ready when all pass and the service is not shutting down."""

    checks: dict[str, Callable[[], bool]] = field(default_factory=dict)
    shutting_down: bool = False

    def add(self, name: str, check: Callable[[], bool]) -> None:
        self.checks[name] = check

    def report(self) -> tuple[bool, dict[str, bool]]:
        results = {name: bool(check()) for name, check in self.checks.items()}
        results["accepting"] = not self.shutting_down
        return all(results.values()), results


def _json(content: object, status_code: int = 200) -> Response:
    # Not ORJSONResponse: FastAPI deprecates it, and the warning is an error under test.
    return Response(orjson.dumps(content), status_code=status_code, media_type="application/json")


def ops_router(readiness: Readiness, registry: CollectorRegistry) -> APIRouter:
    """The three operational endpoints; mount them on every service app."""
    router = APIRouter(include_in_schema=False)

    @router.get("/healthz")
    async def healthz() -> Response:
        return _json({"status": "ok"})

    @router.get("/readyz")
    async def readyz() -> Response:
        ready, checks = readiness.report()
        return _json(
            {"status": "ready" if ready else "not ready", "checks": checks},
            status_code=200 if ready else 503,
        )

    exposed = exposition_registry(registry)

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(exposed), media_type=CONTENT_TYPE_LATEST)

    return router


SHUTDOWN_HOOKS = "shutdown_begins"


def when_shutdown_begins(app: FastAPI, callback: Callable[[], None]) -> None:
    """``callback`` runs when the server begins its graceful shutdown, before it waits for
    the open responses to end: a response that never ends by itself (a server-sent events
    stream) ends there, or it would hold the shutdown for its whole grace period."""
    hooks: list[Callable[[], None]] | None = getattr(app.state, SHUTDOWN_HOOKS, None)
    if hooks is None:
        hooks = []
        setattr(app.state, SHUTDOWN_HOOKS, hooks)
    hooks.append(callback)


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, hooks: list[Callable[[], None]]) -> None:
        super().__init__(config)
        self._hooks = hooks

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for hook in self._hooks:
            hook()
        await super().shutdown(sockets)


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus-client's multiprocess mode: set (to a directory the processes share) before
the workers of one service start, each worker writes its samples there."""


def exposition_registry(registry: CollectorRegistry) -> CollectorRegistry:
    """What ``/metrics`` answers: ``registry``, or, when the process is one of several
    workers (:data:`MULTIPROC_ENV` set), every worker's samples merged (counters and
    histograms summed, each gauge as its ``multiprocess_mode`` says), whichever worker
    the scrape reached."""
    path = os.environ.get(MULTIPROC_ENV)
    if not path:
        return registry
    merged = CollectorRegistry()
    MultiProcessCollector(merged, path=path)  # type: ignore[no-untyped-call]
    return merged


def uvicorn_options(
    settings: ServiceSettings,
    *,
    http: str | Callable[..., asyncio.Protocol] = "httptools",
    factory: bool = False,
) -> dict[str, Any]:
    """uvicorn's configuration of a Hotseat service: all of it but the app and its workers."""
    return {
        "host": settings.host,
        "port": settings.port,
        "loop": "uvloop",
        "http": http,
        # No Hotseat service speaks WebSocket: an Upgrade request is answered as the plain
        # HTTP request it also is (a WebSocket handshake would otherwise get uvicorn's
        # own 403, outside every service's error shape).
        "ws": "none",
        "lifespan": "on",
        "log_config": None,
        "access_log": False,
        "timeout_graceful_shutdown": max(1, int(settings.shutdown_grace)),
        "timeout_keep_alive": 30,
        # No answer names the server software it runs on (uvicorn's "server: uvicorn").
        "server_header": False,
        # X-Forwarded-For names the client only when a proxy the operator trusts sent it
        # (uvicorn's default trusts any connection from this host): the router tells
        # clients apart by address, and one client must not pass for many.
        "proxy_headers": settings.forwarded_allow_ips is not None,
        "forwarded_allow_ips": settings.forwarded_allow_ips,
        "factory": factory,
    }


def run_app(
    app: FastAPI | str,
    settings: ServiceSettings,
    *,
    workers: int = 1,
    factory: bool = False,
    http: str | Callable[..., asyncio.Protocol] = "httptools",
) -> None:
    """Serve ``app`` until SIGINT/SIGTERM; in-flight requests get ``shutdown_grace`` seconds.

    With ``workers > 1`` the app must be an import string (each worker imports it and reads
    its settings from the environment). ``http`` is uvicorn's HTTP protocol: its name, or
    a factory of connection protocols (which must pickle, for workers).
    """
    options = uvicorn_options(settings, http=http, factory=factory)
    if workers > 1:
        # A worker answers its supervisor's health pings only once it has imported the
        # app: on a loaded host that takes more than uvicorn's default 5 s, and the
        # supervisor would kill and restart it for ever.
        uvicorn.run(app, workers=workers, timeout_worker_healthcheck=60, **options)
    else:
        hooks = [] if isinstance(app, str) else getattr(app.state, SHUTDOWN_HOOKS, [])
        _Server(uvicorn.Config(app, **options), hooks).run()
