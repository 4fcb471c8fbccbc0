"""The router's ASGI app and its lifespan.

:class:`RouterApp` is a FastAPI app whose three proxy endpoints bypass the framework
(see :mod:`hotseat_router.proxy`); everything else (``/v1/models``, ``/healthz``,
``/readyz``, ``/metrics``) is ordinary FastAPI. The lifespan owns every connection
through one ``AsyncExitStack`` and hands the request path its objects through the
lifespan state, never through module globals.

Shutdown (uvicorn, on SIGTERM): stop accepting, let in-flight requests and streams finish
within ``shutdown_grace``, then this lifespan closes: readiness goes false, the activation
client stops, upstream connections close, queued audit events are flushed, NATS drains,
and one line tallies what was served.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from http import HTTPStatus
from typing import Any, cast

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from nats.aio.client import Client as NatsClient
from prometheus_client import CollectorRegistry, multiprocess
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route, request_response

from hotseat_common.audit_stream import AuditPublisher, AuditStreamSpec, ensure_audit_stream
from hotseat_common.config import HotseatConfig, load_config
from hotseat_common.connections import connect_nats
from hotseat_common.errors import HotseatError
from hotseat_common.logging import configure_logging, get_logger
from hotseat_common.metrics import RouterMetrics
from hotseat_common.service import MULTIPROC_ENV, Readiness, ops_router
from hotseat_common.subjects import Subjects
from hotseat_common.tracing import Tracing, start_tracing
from hotseat_router.activation.factory import build_activation
from hotseat_router.activation.protocol import ActivationClient
from hotseat_router.asgi import Message, Receive, Scope, Send
from hotseat_router.audit import RequestAudit
from hotseat_router.auth import ApiKeyCheck, load_api_keys
from hotseat_router.budget import BodyBudget
from hotseat_router.catalog import Catalog, build_catalog
from hotseat_router.dispatch import Dispatcher
from hotseat_router.errors import (
    InvalidRequest,
    MethodNotAllowed,
    ModelNotFound,
    Unauthorized,
    UnknownUrl,
    error_answer,
    internal_error,
)
from hotseat_router.headers import REQUEST_ID_B, request_id_of
from hotseat_router.health import HealthPolicy, PassiveHealth
from hotseat_router.matching import Matcher
from hotseat_router.memory import freeze_startup_heap, return_large_blocks_to_the_os
from hotseat_router.openapi import router_openapi
from hotseat_router.proxy import PROXY_PATHS, ProxyEndpoint
from hotseat_router.settings import RouterSettings, router_name
from hotseat_router.streaming import Relay
from hotseat_router.upstream import UpstreamClient

log = get_logger(__name__)

ActivationFactory = Callable[[RouterSettings, NatsClient, HotseatConfig, Tracing], ActivationClient]


def _bearers(config: HotseatConfig) -> dict[str, str]:
    """Upstream API keys of cloud backends, read once from their ``credentialsEnv``."""
    out = {}
    for backend in config.backends:
        if backend.credentials_env:
            key = os.environ.get(backend.credentials_env, "")
            if key:
                out[backend.name] = key
            else:
                log.warning(
                    "backend_credentials_missing", backend=backend.name, env=backend.credentials_env
                )
    return out


class RouterApp(FastAPI):
    """FastAPI, with the proxy endpoints answered before the framework sees them, and no
    answer of its own that is not the router's: whatever the framework would answer
    (an unknown path, a method no route takes, an exception) is an OpenAI error with a
    request id, and an exception's text only goes to the log."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        guarded = _Guarded(send)
        try:
            if scope["method"] == "POST" and scope["path"] in PROXY_PATHS:
                proxy: ProxyEndpoint = scope["state"]["proxy"]
                await proxy(scope, receive, guarded)
            else:
                await super().__call__(scope, receive, _stamp_request_id(scope, guarded))
        except Exception as exc:
            # A framework route's failure was answered by the Exception handler of
            # _answer_framework_errors (Starlette raises it again after); the proxy
            # answers its own, so one from it came after its answer began.
            request_id = _request_id(scope)
            log.exception("request_failed", request_id=request_id, exc_info=exc)
            if not guarded.started:
                status, headers, body = error_answer(internal_error(request_id))
                headers.append((REQUEST_ID_B, request_id.encode()))
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})


class _Guarded:
    """A ``send`` that remembers whether the response has begun."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)


def _request_id(scope: Scope) -> str:
    """The request's id, made once per request (the client's valid one, or a new one)."""
    state = scope.setdefault("state", {})
    request_id: str | None = state.get("request_id")
    if request_id is None:
        client = next((v for k, v in scope["headers"] if k == REQUEST_ID_B), None)
        request_id = state["request_id"] = request_id_of(client)
    return request_id


def _stamp_request_id(scope: Scope, send: Send) -> Send:
    """Every response carries ``x-hotseat-request-id`` (the client's, or a new one)."""
    request_id = _request_id(scope)

    async def stamped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", []), (REQUEST_ID_B, request_id.encode())]
        await send(message)

    return stamped


def create_app(
    settings: RouterSettings,
    config: HotseatConfig,
    *,
    activation_factory: ActivationFactory = build_activation,
    health_clock: Callable[[], float] = time.monotonic,
) -> RouterApp:
    """The router for ``config``; nothing connects until the lifespan starts.
    ``health_clock`` is what backend quarantines are timed on (tests step it by hand)."""
    name = router_name(settings, config)
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry)
    readiness = Readiness()
    auth = ApiKeyCheck(load_api_keys(settings, config.router))
    matcher = Matcher(config)
    catalog = build_catalog(config, matcher)
    policy = config.router

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        async with AsyncExitStack() as stack:
            tracing = start_tracing("router", name, settings.otlp_endpoint)
            stack.push_async_callback(asyncio.to_thread, tracing.shutdown)
            nc = await connect_nats(settings, name=f"hotseat-router-{name}")
            stack.push_async_callback(_drain, nc)
            subjects = Subjects(settings.subject_prefix)
            await ensure_audit_stream(
                nc.jetstream(), AuditStreamSpec(name=settings.audit_stream, subjects=subjects)
            )
            publisher = AuditPublisher(
                nc, subjects, metrics.audit_publish, max_buffer=settings.audit_buffer
            )
            publisher.start()
            stack.push_async_callback(publisher.close, max(1.0, settings.shutdown_grace))
            upstream = UpstreamClient(
                connections_per_host=settings.upstream_connections,
                keepalive_s=settings.upstream_keepalive,
            )
            stack.push_async_callback(upstream.close)
            activation = activation_factory(settings, nc, config, tracing)
            if isinstance(activation, AbstractAsyncContextManager):
                await stack.enter_async_context(activation)

            for backend in config.backends:
                metrics.backend_healthy.labels(name, backend.name).set(1)

            def on_health(backend: str, healthy: bool) -> None:
                metrics.backend_healthy.labels(name, backend).set(1 if healthy else 0)
                log.warning("backend_health", backend=backend, healthy=healthy)

            audit = RequestAudit(publisher, metrics, name, access_log=settings.access_log)
            dispatcher = Dispatcher(
                policy=policy,
                pool_budgets={p.name: p.swap_budget for p in config.pools},
                health=PassiveHealth(
                    HealthPolicy(
                        quarantine_s=policy.quarantine,
                        failures=settings.health_failures,
                        window_s=settings.health_window,
                        clients=settings.health_clients,
                    ),
                    on_change=on_health,
                    clock=health_clock,
                ),
                upstream=upstream,
                activation=activation,
                audit=audit,
                metrics=metrics,
                router=name,
                bearers=_bearers(config),
                tracing=tracing,
            )
            relay = Relay(
                audit=audit,
                metrics=metrics,
                router=name,
                idle_timeout=policy.stream_idle_timeout,
            )
            proxy = ProxyEndpoint(
                matcher=matcher,
                dispatcher=dispatcher,
                relay=relay,
                auth=auth,
                audit=audit,
                metrics=metrics,
                router=name,
                max_body_bytes=policy.max_body_bytes,
                max_json_depth=settings.max_json_depth,
                body_budget=BodyBudget(settings.body_budget_bytes),
                body_timeout=settings.body_timeout,
                request_timeout=policy.request_timeout,
                sensitive=frozenset(s.lower() for s in policy.classification.sensitive),
                tracing=tracing,
            )
            readiness.add("config", lambda: True)
            readiness.add("nats", lambda: nc.is_connected)
            log.info(
                "router_started",
                router=name,
                backends=len(config.backends),
                rules=len(config.rules),
                api_keys=auth.enabled,
                frozen_objects=freeze_startup_heap(),
            )
            try:
                yield {"proxy": proxy}
            finally:
                readiness.shutting_down = True
                log.info("router_stopping", tally=_tally(metrics, name))
                _leave_merged_metrics()

    app = RouterApp(
        title="Hotseat router",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        # No 307 to the path with a slash added or removed: its Location would echo the
        # client's Host header, and every path the router serves has one spelling.
        redirect_slashes=False,
    )
    _serve_openapi(app, router_openapi(api_keys=auth.enabled))
    app.include_router(ops_router(readiness, registry))

    _mount_models(app, auth, catalog)
    _mount_unknown_v1(app, auth)
    _answer_framework_errors(app)

    return app


def _mount_models(app: RouterApp, auth: ApiKeyCheck, catalog: Catalog) -> None:
    """``GET /v1/models`` and ``GET /v1/models/{id}`` (:mod:`hotseat_router.catalog`)."""

    @app.api_route("/v1/models", methods=["GET", "HEAD"])
    async def list_models(request: Request) -> Response:
        if not auth.allows(_header(request, b"authorization")):
            return _error_response(Unauthorized("missing or invalid API key"))
        return Response(catalog.listing, media_type="application/json")

    @app.api_route("/v1/models/{model:path}", methods=["GET", "HEAD"])
    async def get_model(request: Request, model: str) -> Response:
        if not auth.allows(_header(request, b"authorization")):
            return _error_response(Unauthorized("missing or invalid API key"))
        entry = catalog.entry(model)
        if entry is None:
            return _error_response(
                ModelNotFound(f"The model {model!r} does not exist: GET /v1/models lists them")
            )
        return Response(entry, media_type="application/json")


def _serve_openapi(app: RouterApp, document: dict[str, Any]) -> None:
    """``/openapi.json`` is the hand-written document (the proxy paths are raw ASGI)."""

    def openapi() -> dict[str, Any]:
        return document

    app.openapi = openapi  # type: ignore[method-assign]


MODEL_PATH = "/v1/models/"
_METHODS = {**dict.fromkeys(PROXY_PATHS, "POST"), "/v1/models": "GET, HEAD"}
"""The methods each known /v1 path answers (any other method gets 405)."""


def _mount_unknown_v1(app: RouterApp, auth: ApiKeyCheck) -> None:
    async def unknown_v1(request: Request) -> Response:
        """Any other /v1 path or method: 401 without a valid key (an unauthenticated
        client learns nothing about which paths exist), else an OpenAI-shaped 405 (a
        known path) or 404."""
        if not auth.allows(_header(request, b"authorization")):
            return _error_response(Unauthorized("missing or invalid API key"))
        path = request.url.path
        allowed = _METHODS.get(path) or ("GET, HEAD" if path.startswith(MODEL_PATH) else None)
        if allowed is not None:
            return _error_response(
                MethodNotAllowed(f"Method {request.method} not allowed on {path}", allow=allowed)
            )
        return _error_response(UnknownUrl(f"Invalid URL ({request.method} {path})"))

    app.router.routes.append(
        Route("/v1/{path:path}", _AnyMethod(unknown_v1), include_in_schema=False)
    )


class _AnyMethod:
    """An endpoint as a plain ASGI app: a Starlette route to one takes every method
    (``TRACE``, ``CONNECT``, ...), where a route to a function takes only those it lists."""

    def __init__(self, endpoint: Callable[[Request], Awaitable[Response]]) -> None:
        self._app = request_response(endpoint)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


def _answer_framework_errors(app: RouterApp) -> None:
    """What Starlette and FastAPI would answer themselves, in the router's shape: no route
    for the path (404), none for the method (405, with ``Allow``), a request a route
    cannot read (400), an exception (500, its text only in the log, by
    :class:`RouterApp`)."""

    async def http_error(request: Request, error: Exception) -> Response:
        exc = cast("StarletteHTTPException", error)
        path = request.url.path
        if exc.status_code == HTTPStatus.METHOD_NOT_ALLOWED:
            allow = (exc.headers or {}).get("Allow", "")
            return _error_response(
                MethodNotAllowed(f"Method {request.method} not allowed on {path}", allow=allow)
            )
        if exc.status_code == HTTPStatus.NOT_FOUND:
            return _error_response(UnknownUrl(f"Invalid URL ({request.method} {path})"))
        if exc.status_code < HTTPStatus.INTERNAL_SERVER_ERROR:
            return _error_response(InvalidRequest(str(exc.detail)), status=exc.status_code)
        return _error_response(internal_error(_request_id(request.scope)))

    async def invalid(request: Request, _exc: Exception) -> Response:
        return _error_response(
            InvalidRequest(f"Invalid request ({request.method} {request.url.path})")
        )

    async def failed(request: Request, _exc: Exception) -> Response:
        return _error_response(internal_error(_request_id(request.scope)))

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(Exception, failed)


def _error_response(exc: HotseatError, *, status: int | None = None) -> Response:
    """The one error table's answer (:func:`~hotseat_router.errors.error_answer`) as a
    framework response (with another ``status`` for a framework error the table does not
    name)."""
    table_status, headers, body = error_answer(exc)
    return Response(
        body,
        status_code=status or table_status,
        headers={k.decode(): v.decode() for k, v in headers},
    )


def _header(request: Request, name: bytes) -> bytes | None:
    return next((v for k, v in request.scope["headers"] if k == name), None)


def _tally(metrics: RouterMetrics, name: str) -> dict[str, int]:
    """Requests by outcome since start, for the one-line shutdown log."""
    counts: dict[str, int] = {}
    for family in metrics.requests.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels.get("router") == name:
                outcome = sample.labels["outcome"]
                counts[outcome] = counts.get(outcome, 0) + math.floor(sample.value)
    return counts


def _leave_merged_metrics() -> None:
    """A worker of several that stops takes its live gauges (in flight, held) out of the
    merged ``/metrics`` (prometheus-client's multiprocess mode)."""
    if os.environ.get(MULTIPROC_ENV):
        multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]


async def _drain(nc: NatsClient) -> None:
    with contextlib.suppress(Exception):
        await nc.drain()


def app_from_env() -> RouterApp:
    """Factory for ``uvicorn --factory`` (several workers): settings from ``HOTSEAT_*``."""
    settings = RouterSettings()
    configure_logging(
        "router", level=settings.log_level, fmt=settings.log_format, instance=settings.instance
    )
    if settings.config is None:
        raise SystemExit("HOTSEAT_CONFIG is not set")
    return_large_blocks_to_the_os()  # each worker is a process of its own
    return create_app(settings, load_config(settings.config))
