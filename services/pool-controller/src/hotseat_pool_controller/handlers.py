"""NATS request/reply handlers of the activation protocol (queue group: replicas share work).

Each request runs in its own task (a slow idle check never blocks other pools), at most
``max_concurrent_requests`` at once. Errors are translated here, at the edge: a reply body
with a stable code, plus the ``Nats-Service-Error`` / ``-Code`` headers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from pydantic import ValidationError
from redis.exceptions import RedisError

from hotseat_common import tracing as spans
from hotseat_common.errors import ErrorCode
from hotseat_common.headers import service_error
from hotseat_common.logging import get_logger
from hotseat_common.messages import (
    Ack,
    AcquireRequest,
    CancelRequest,
    DispatchFailureReport,
    ErrorReply,
    PlaceRequest,
    ReleaseRequest,
    RenewReply,
    RenewRequest,
    WireModel,
)
from hotseat_common.subjects import CONTROLLER_QUEUE_GROUP, Subjects
from hotseat_common.tracing import NO_TRACING, Kind, Tracing
from hotseat_pool_controller.runtime.answers import PoolAnswers
from hotseat_pool_controller.runtime.placement import GroupPlacer
from hotseat_pool_controller.store.health import StoreHealth
from hotseat_pool_controller.store.pool import ConflictError, Renewal

log = get_logger(__name__)

UNAVAILABLE_RETRY_AFTER_S = 1.0

Handler = Callable[[bytes], Coroutine[Any, Any, WireModel]]


class ActivationHandlers:
    def __init__(
        self,
        nc: NatsClient,
        subjects: Subjects,
        pools: Mapping[str, PoolAnswers],
        max_concurrent: int,
        health: StoreHealth | None = None,
        *,
        tracing: Tracing = NO_TRACING,
        placers: Mapping[str, GroupPlacer] | None = None,
    ) -> None:
        self._nc = nc
        self._placers = placers or {}
        self._tracing = tracing
        self._health = health
        self._subjects = subjects
        self._pools = pools
        self._limit = asyncio.Semaphore(max_concurrent)
        self._tasks: set[asyncio.Task[None]] = set()
        self._subs: list[Subscription] = []

    async def start(self) -> None:
        routes: dict[str, Handler] = {
            self._subjects.acquire: self._acquire,
            self._subjects.release: self._release,
            self._subjects.renew: self._renew,
            self._subjects.cancel: self._cancel,
            self._subjects.report: self._report,
        }
        if self._placers:
            routes[self._subjects.place] = self._place
        for subject, handler in routes.items():
            sub = await self._nc.subscribe(
                subject, queue=CONTROLLER_QUEUE_GROUP, cb=self._dispatcher(handler)
            )
            self._subs.append(sub)

    async def stop(self, grace: float) -> None:
        """Stop taking requests, then let the ones in progress answer."""
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except NatsError as exc:
                log.warning("unsubscribe_failed", error=type(exc).__name__)
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=grace)

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def _dispatcher(self, handler: Handler) -> Callable[[Msg], Awaitable[None]]:
        async def on_message(msg: Msg) -> None:
            task = asyncio.create_task(self._serve(handler, msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        return on_message

    async def _serve(self, handler: Handler, msg: Msg) -> None:
        async with self._limit:
            headers: dict[str, str] | None = None
            try:
                reply = await self._answer(handler, msg)
            except ValidationError as exc:
                reply = ErrorReply(code=ErrorCode.BAD_REQUEST, message=_short(exc))
                headers = service_error(reply.message, 400)
            except ConflictError as exc:
                # Every attempt lost a race: answer like an unavailable store (fail closed,
                # the router retries after Retry-After) instead of leaving it to time out.
                log.warning("decision_contended", subject=msg.subject, error=str(exc))
                reply, headers = self._unavailable(
                    msg.subject, "pool state contended; retry shortly", "pool state contended"
                )
            except RedisError as exc:
                log.warning("store_unreachable", subject=msg.subject, error=str(exc))
                reply, headers = self._unavailable(
                    msg.subject, "pool state store unreachable", "store unreachable"
                )
            if not msg.reply:
                return
            try:
                await self._nc.publish(msg.reply, reply.to_bytes(), headers=headers)
            except NatsError as exc:
                log.warning("reply_failed", subject=msg.subject, error=type(exc).__name__)

    async def _answer(self, handler: Handler, msg: Msg) -> WireModel:
        """The handler's reply; an acquire in its span when tracing is on, continuing the
        router's trace from the request's headers (a swap it starts joins it)."""
        if not self._tracing.enabled or msg.subject != self._subjects.acquire:
            work = handler(msg.data)
            return await (self._health.guard(work) if self._health else work)
        with self._tracing.span(
            spans.ACQUIRE_SPAN, kind=Kind.SERVER, carrier=msg.headers or {}
        ) as span:
            work = handler(msg.data)
            reply = await (self._health.guard(work) if self._health else work)
            span.set(spans.SWAP_ID, getattr(reply, "swap_id", None))
            span.set(spans.RESULT, getattr(reply, "status", None))
            return reply

    def _unavailable(
        self, subject: str, message: str, header: str
    ) -> tuple[WireModel, dict[str, str]]:
        """The fail-closed answer while the store cannot decide: retry after a second."""
        reply: WireModel = ErrorReply(
            code=ErrorCode.CONTROLLER_UNAVAILABLE,
            message=message,
            retry_after_s=UNAVAILABLE_RETRY_AFTER_S,
        )
        if subject == self._subjects.renew:
            reply = RenewReply(ok=False, code=ErrorCode.CONTROLLER_UNAVAILABLE)
        return reply, service_error(header, 503)

    def _pool(self, name: str) -> PoolAnswers | None:
        return self._pools.get(name)

    async def _acquire(self, data: bytes) -> WireModel:
        request = AcquireRequest.from_bytes(data)
        pool = self._pool(request.pool)
        if pool is None:
            return ErrorReply(code=ErrorCode.UNKNOWN_POOL, message=f"no pool {request.pool!r}")
        return await pool.acquire(request)

    async def _release(self, data: bytes) -> WireModel:
        request = ReleaseRequest.from_bytes(data)
        pool = self._pool(request.pool)
        if pool is None:
            return Ack(ok=False, code=ErrorCode.UNKNOWN_POOL, message=f"no pool {request.pool!r}")
        released = await pool.release(
            request.member, request.lease_id, request.requests or 1, request.longest_s
        )
        await self._group_lease(request.group, request.pool, request.lease_id, None)
        return Ack(ok=released)  # reply optional

    async def _renew(self, data: bytes) -> WireModel:
        request = RenewRequest.from_bytes(data)
        pool = self._pool(request.pool)
        if pool is None:
            return RenewReply(ok=False, code=ErrorCode.UNKNOWN_POOL)
        renewed = await pool.renew(request)
        if renewed.outcome is Renewal.RENEWED:
            ttl_ms = pool.policy.lease_ttl_ms
            await self._group_lease(request.group, request.pool, request.lease_id, ttl_ms)
        if renewed.outcome is Renewal.UNKNOWN:
            return RenewReply(ok=False, code=ErrorCode.RECONCILING)
        ok = renewed.outcome is Renewal.RENEWED
        return RenewReply(
            ok=ok,
            ttl_s=pool.policy.lease_ttl_ms / 1000 if ok else 0.0,
            shareable=renewed.shareable,
        )

    async def _cancel(self, data: bytes) -> WireModel:
        request = CancelRequest.from_bytes(data)
        pool = self._pool(request.pool)
        if pool is None:
            return Ack(ok=False, code=ErrorCode.UNKNOWN_POOL, message=f"no pool {request.pool!r}")
        cancelled = await pool.cancel(request.member, request.attempt)
        placer = self._placers.get(request.group) if request.group else None
        if placer is not None:
            await placer.store.forget_waiter(request.pool, request.attempt)
        return Ack(ok=cancelled)

    async def _place(self, data: bytes) -> WireModel:
        request = PlaceRequest.from_bytes(data)
        placer = self._placers.get(request.group)
        if placer is None:
            return ErrorReply(code=ErrorCode.UNKNOWN_POOL, message=f"no group {request.group!r}")
        return await placer.place(request)

    async def _group_lease(
        self, group: str | None, pool: str, lease_id: str, ttl_ms: int | None
    ) -> None:
        """A lease placed by a group was renewed (``ttl_ms``) or released (``None``)."""
        placer = self._placers.get(group) if group else None
        if placer is not None:
            await placer.store.touch(pool, lease_id, ttl_ms)

    async def _report(self, data: bytes) -> WireModel:
        report = DispatchFailureReport.from_bytes(data)
        pool = self._pool(report.pool)
        if pool is None:
            return Ack(ok=False, code=ErrorCode.UNKNOWN_POOL, message=f"no pool {report.pool!r}")
        await pool.report_failure(report.member, report.reason)
        return Ack()


def _short(exc: ValidationError) -> str:
    first = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first["loc"])
    return (
        f"invalid request: {where}: {first['msg']}" if where else f"invalid request: {first['msg']}"
    )
