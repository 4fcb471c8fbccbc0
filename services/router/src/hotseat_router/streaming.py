"""Relaying an upstream answer to the client chunk by chunk, as it arrives.

The body is never buffered: each piece the upstream sends is written at once, so the
first byte of a stream reaches the client as soon as the upstream produces it. Between
pieces the upstream has ``router.streamIdleTimeout``. Whatever ends the relay (the body's
end, an upstream error, a lost lease, the client leaving), the ``finally`` block closes
the upstream response (which cancels an unfinished upstream request), releases the lease
and records the request's one terminal audit event.

A relay that cannot finish normally ends an SSE stream with an OpenAI error event; any
other body is cut off (the connection is aborted) so the client cannot mistake a partial
body for a complete one.
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus

from hotseat_common.errors import ErrorCode
from hotseat_common.messages.audit import RequestOutcome
from hotseat_common.metrics import RouterMetrics, Series
from hotseat_router.asgi import Send
from hotseat_router.audit import RequestAudit
from hotseat_router.context import RequestContext
from hotseat_router.dispatch import Dispatched
from hotseat_router.errors import error_body
from hotseat_router.headers import client_response_headers
from hotseat_router.keepalive import HeldStream
from hotseat_router.upstream import UpstreamBodyError, UpstreamResponse
from hotseat_router.usage import UsageMeter

_STREAM_ERRORS = {
    ErrorCode.STREAM_IDLE_TIMEOUT: "the upstream sent nothing for too long",
    ErrorCode.UPSTREAM_BODY_ERROR: "the upstream broke the connection mid-response",
    ErrorCode.LEASE_LOST: "the pool member's activation lease was lost mid-response",
}


SSE = "text/event-stream"


class StreamAborted(Exception):
    """Raised to the server so it drops a connection whose body cannot be completed."""


def _sse_error(reason: ErrorCode) -> bytes:
    return b"data: " + error_body(_STREAM_ERRORS[reason], "server_error", reason) + b"\n\n"


class Relay:
    def __init__(
        self,
        *,
        audit: RequestAudit,
        metrics: RouterMetrics,
        router: str,
        idle_timeout: float,
    ) -> None:
        self._audit = audit
        self._time_to_first_byte = Series(metrics.time_to_first_byte)
        self._router = router
        self._idle = idle_timeout

    async def __call__(self, ctx: RequestContext, dispatched: Dispatched, send: Send) -> None:
        response = dispatched.response
        backend = dispatched.backend
        ctx.answered_by(backend, response.status)
        self._time_to_first_byte(self._router, backend.name).observe(ctx.elapsed())
        scope = dispatched.lease
        if scope is not None and scope.lease.ttl_s > 0:
            ctx.watch_lease(scope.lease.lost)
        failure: ErrorCode | None = None
        try:
            failure = await self._pump(ctx, dispatched, send)
        except asyncio.CancelledError:
            failure = ctx.absorb_interrupt()
            if failure is None:
                self._audit.finish(ctx, RequestOutcome.CLIENT_DISCONNECTED, reason="cancelled")
                raise
        finally:
            ctx.unwatch_lease()
            response.close()
            if scope is not None:
                await scope.close()
        if failure is None:
            self._audit.finish(ctx, RequestOutcome.SERVED)
        elif failure is ErrorCode.CLIENT_DISCONNECTED:
            self._audit.finish(ctx, RequestOutcome.CLIENT_DISCONNECTED, reason=failure)
        else:
            self._audit.finish(ctx, RequestOutcome.SERVED, reason=failure)
            held = ctx.held_stream
            if response.content_type != "text/event-stream" and not (held and held.started):
                raise StreamAborted(_STREAM_ERRORS[failure])
            ctx.last_body()
            await send({"type": "http.response.body", "body": _sse_error(failure)})

    async def _pump(
        self, ctx: RequestContext, dispatched: Dispatched, send: Send
    ) -> ErrorCode | None:
        """Copy the body; ``None`` when it ended normally, else why it stopped."""
        response = dispatched.response
        lease = dispatched.lease.lease if dispatched.lease is not None else None
        held = ctx.held_stream
        meter = UsageMeter() if response.status < HTTPStatus.BAD_REQUEST else None
        if held is not None and held.started:
            # The headers went while the request was held: name the backend (and the swap)
            # in comments; a body that is not a stream (an error) becomes the last event.
            await held.served_by(dispatched.backend.name, swap_id=ctx.swap_id)
            if response.status >= HTTPStatus.BAD_REQUEST or response.content_type != SSE:
                return await self._as_last_event(ctx, response, held)
        else:
            pooled = dispatched.backend.pool is not None
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status,
                    "headers": client_response_headers(
                        response.headers,
                        backend=dispatched.backend.name.encode(),
                        request_id=ctx.request_id.encode(),
                        hold_ms=ctx.hold_ms() if pooled else None,
                        swap_id=ctx.swap_id if pooled else None,
                        placement=ctx.placement_header(),
                    ),
                }
            )
        while True:
            chunk = await self._next(response)
            if isinstance(chunk, ErrorCode):
                return chunk
            if lease is not None and lease.expired():
                return (
                    ErrorCode.LEASE_LOST
                )  # never relay past the lease (a stalled loop resumes here)
            if meter is not None and chunk:
                meter.feed(chunk)
            if not chunk or response.body_known_complete:
                if meter is not None:
                    ctx.usage = meter.usage()
                ctx.last_body()
                await send({"type": "http.response.body", "body": chunk})
                return None
            await send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def _next(self, response: UpstreamResponse) -> bytes | ErrorCode:
        """The body's next piece (``b""`` at its end), or why none came in time. What
        already came is taken without arming the idle timer (a small body usually came
        whole with its head)."""
        try:
            chunk = response.chunk_at_hand()
            if chunk is None:
                async with asyncio.timeout(self._idle):
                    chunk = await response.chunk()
        except TimeoutError:
            return ErrorCode.STREAM_IDLE_TIMEOUT
        except UpstreamBodyError:
            return ErrorCode.UPSTREAM_BODY_ERROR
        return chunk

    async def _as_last_event(
        self, ctx: RequestContext, response: UpstreamResponse, held: HeldStream
    ) -> ErrorCode | None:
        """An upstream body that is not a stream, sent whole as the held stream's last
        event (it is small: an error, or a stream the upstream refused to make)."""
        pieces: list[bytes] = []
        while True:
            chunk = await self._next(response)
            if isinstance(chunk, ErrorCode):
                return chunk
            if not chunk:
                break
            pieces.append(chunk)
        ctx.last_body()
        await held.event(b"".join(pieces).strip(), last=True)
        return None
