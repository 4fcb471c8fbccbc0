"""The hot path: ``POST /v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings``.

Raw ASGI rather than a framework route, because this is a proxy, not a form handler:
headers are scanned once, the body is read once (with its size limit) and parsed only
for ``model`` and ``stream``, and the bytes go upstream untouched unless a backend
rewrites the model. Every request ends in exactly one terminal audit event.
"""

from __future__ import annotations

import asyncio
import string
from typing import NamedTuple
from urllib.parse import quote

from hotseat_common import tracing as spans
from hotseat_common.errors import HotseatError
from hotseat_common.logging import get_logger
from hotseat_common.messages.audit import RequestOutcome
from hotseat_common.metrics import RouterMetrics
from hotseat_common.tracing import NO_TRACING, Kind, Span, Tracing
from hotseat_router.asgi import Receive, Scope, Send
from hotseat_router.audit import RequestAudit
from hotseat_router.auth import ApiKeyCheck
from hotseat_router.body import parse_body, read_body
from hotseat_router.budget import BodyBudget, BodyClaim
from hotseat_router.context import RequestContext
from hotseat_router.dispatch import Dispatched, Dispatcher, Outbound
from hotseat_router.errors import (
    InvalidRequest,
    ModelNotFound,
    Unauthorized,
    error_answer,
    internal_error,
    spec_for,
)
from hotseat_router.headers import REQUEST_ID_B, end_to_end_headers, request_id_of
from hotseat_router.keepalive import HeldStream
from hotseat_router.matching import DEFAULT_ROUTE, Matcher, Route
from hotseat_router.priority import request_priority
from hotseat_router.rewrite import locate_model
from hotseat_router.streaming import Relay

log = get_logger(__name__)

PROXY_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})
_QUERY_AS_IS = string.punctuation
"""A query string goes upstream byte for byte, percent escapes and all; only a byte that
may not stand in a URL as it is (not printable ASCII) is written as its escape."""


class ProxyEndpoint:
    def __init__(
        self,
        *,
        matcher: Matcher,
        dispatcher: Dispatcher,
        relay: Relay,
        auth: ApiKeyCheck,
        audit: RequestAudit,
        metrics: RouterMetrics,
        router: str,
        max_body_bytes: int,
        max_json_depth: int,
        body_budget: BodyBudget,
        body_timeout: float,
        request_timeout: float,
        sensitive: frozenset[str],
        tracing: Tracing = NO_TRACING,
    ) -> None:
        self._tracing = tracing
        self._matcher = matcher
        self._dispatcher = dispatcher
        self._relay = relay
        self._auth = auth
        self._audit = audit
        self._in_flight = metrics.in_flight.labels(router)
        self._priority_ignored = metrics.priority_header_ignored
        self._router = router
        self._max_body = max_body_bytes
        self._max_depth = max_json_depth
        self._budget = body_budget
        self._body_timeout = body_timeout
        self._request_timeout = request_timeout
        self._sensitive = sensitive

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client_request_id: bytes | None = None
        authorization: bytes | None = None
        content_length: bytes | None = None
        for name, value in scope["headers"]:
            if name == REQUEST_ID_B:
                client_request_id = value
            elif name == b"authorization":
                authorization = value
            elif name == b"content-length":
                content_length = value
        peer = scope.get("client")
        key = self._auth.key_id(authorization)
        ctx = RequestContext(
            request_id=request_id_of(client_request_id),
            client=key or (peer[0] if peer else ""),
            api_key=key,
        )
        self._in_flight.inc()
        span = self._tracing.span(
            spans.REQUEST_SPAN, {spans.REQUEST_ID: ctx.request_id}, kind=Kind.SERVER
        )
        try:
            with span as spanned:
                try:
                    dispatched = await self._dispatch(
                        ctx, scope, receive, send, _Credentials(authorization, content_length)
                    )
                    if dispatched is not None:
                        await self._relay(ctx, dispatched, send)
                finally:
                    if self._tracing.enabled:
                        _describe(spanned, ctx)
        finally:
            ctx.stop_watching()
            self._in_flight.dec()

    async def _dispatch(
        self, ctx: RequestContext, scope: Scope, receive: Receive, send: Send, creds: _Credentials
    ) -> Dispatched | None:
        """Everything up to an upstream's response headers; ``None`` when already answered.
        The body is held (and counted in the body budget) only until then."""
        claim = self._budget.claim()
        try:
            route, outbound = await self._admit(ctx, scope, receive, creds, claim)
            if route.hold_keep_alive is not None and outbound.fields.stream:
                ctx.held_stream = HeldStream(
                    send, request_id=ctx.request_id, interval=route.hold_keep_alive
                )
            ctx.watch_client(scope, receive)
            deadline = ctx.started + self._request_timeout
            return await self._dispatcher.walk(ctx, route, outbound, deadline)
        except HotseatError as exc:
            await self._answer_error(ctx, send, exc)
            return None
        except asyncio.CancelledError:
            reason = ctx.absorb_interrupt()
            self._audit.finish(
                ctx, RequestOutcome.CLIENT_DISCONNECTED, reason=reason or "cancelled"
            )
            if reason is None:
                raise
            return None
        except Exception as exc:
            # The exception's text is for the log only: it may hold anything (addresses,
            # a backend's words, a secret), so the client gets the request id to quote.
            log.exception("request_failed", request_id=ctx.request_id, exc_info=exc)
            await self._answer_error(ctx, send, internal_error(ctx.request_id))
            return None
        finally:
            claim.release()

    async def _admit(
        self,
        ctx: RequestContext,
        scope: Scope,
        receive: Receive,
        creds: _Credentials,
        claim: BodyClaim,
    ) -> tuple[Route, Outbound]:
        """Authenticate, read and parse the body, match a route, find what a backend that
        renames the model must rewrite; raise to reject. Nothing here touches a pool: a
        request that cannot be forwarded exactly is refused before any lease."""
        if not self._auth.allows(creds.authorization):
            raise Unauthorized("missing or invalid API key")
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        try:
            forwarded = end_to_end_headers(headers)
        except UnicodeDecodeError:
            raise InvalidRequest("a request header value is not UTF-8") from None
        body = await read_body(
            receive,
            content_length=_length(creds.content_length),
            limit=self._max_body,
            claim=claim,
            timeout=self._body_timeout,
        )
        fields = parse_body(body, max_depth=self._max_depth)
        ctx.asked_for(fields.model)
        header_map = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers}
        route = self._matcher.route(fields.model, header_map)
        if route is None:
            raise ModelNotFound(
                f"The model {fields.model!r} does not exist: GET /v1/models lists them"
            )
        ctx.routed(route.rule)
        priority = request_priority(route, headers)
        if priority.ignored:
            self._priority_ignored.labels(self._router, route.rule or DEFAULT_ROUTE).inc()
        ctx.priority = priority.value
        classification = self._matcher.classification(header_map)
        path: str = scope["path"]
        if scope["query_string"]:
            path += "?" + quote(scope["query_string"], safe=_QUERY_AS_IS)
        renamed = any(b.model is not None and b.model != fields.model for b in route.backends)
        return route, Outbound(
            path=path,
            body=body,
            fields=fields,
            model_slot=locate_model(body) if renamed else None,
            headers=forwarded,
            sensitive=classification is not None and classification in self._sensitive,
        )

    async def _answer_error(self, ctx: RequestContext, send: Send, exc: HotseatError) -> None:
        spec = spec_for(exc)
        reason = getattr(exc, "reason", None) or exc.code
        if spec.outcome is RequestOutcome.CLIENT_DISCONNECTED:
            self._audit.finish(ctx, spec.outcome, reason=reason)
            return
        status, headers, body = error_answer(exc)
        headers.append((REQUEST_ID_B, ctx.request_id.encode()))
        ctx.last_body()
        self._audit.finish(ctx, spec.outcome, status=status, reason=reason)
        held = ctx.held_stream
        if held is not None and held.started:
            # The held stream's 200 is already sent: the error is its last event.
            await held.event(body, last=True)
            return
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _describe(span: Span, ctx: RequestContext) -> None:
    """The request span's attributes, from what the request's audit event reports."""
    span.set(spans.OUTCOME, ctx.outcome)
    span.set(spans.RULE, ctx.rule)
    span.set(spans.BACKEND, ctx.backend)
    span.set(spans.POOL, ctx.pool)
    span.set(spans.MEMBER, ctx.member)
    span.set(spans.SWAP_ID, ctx.swap_id)
    span.set(spans.STATUS, ctx.status)
    if ctx.usage is not None:
        span.set(spans.INPUT_TOKENS, ctx.usage.prompt_tokens)
        span.set(spans.OUTPUT_TOKENS, ctx.usage.completion_tokens)


class _Credentials(NamedTuple):
    authorization: bytes | None
    content_length: bytes | None


def _length(value: bytes | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidRequest("invalid Content-Length") from None
