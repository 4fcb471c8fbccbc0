"""The fallback walk: try a route's backends in order until one answers.

For each backend, in the rule's order:

1. skip a cloud backend when the request's classification is sensitive (fail-closed);
2. skip a quarantined backend (passive health); after its quarantine it gets one trial;
3. for a pool member, acquire an activation lease (held at most the pool's swapBudget,
   clipped to the request deadline). Incumbent busy or queue full: skip (busy skips are
   audited); activation timeout: answer 503 at once; swap failed: next backend;
   controller unavailable: next backend;
4. send the request with the per-attempt timeout (rule, else backend, else router),
   started only now that the member is leased, clipped to the request deadline;
5. connection errors, per-attempt timeouts and 5xx move on (and count toward the
   backend's quarantine, see :mod:`hotseat_router.health`); any other status (4xx
   included) is the answer.

When nothing answered, the most specific reason wins: fail_closed (a sensitive request
whose cloud backends were withheld), controller_unavailable, pool_incumbent_busy (every
backend tried was busy), pool_queue_full, then all_backends_failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import NamedTuple, Self

from prometheus_client import Gauge, Histogram

from hotseat_common import tracing as spans
from hotseat_common.config.model import Backend, RouterPolicy, Tier
from hotseat_common.errors import (
    ActivationTimeout,
    ControllerUnavailable,
    ErrorCode,
    IncumbentBusy,
    QueueFull,
    SwapFailed,
    UnknownPool,
)
from hotseat_common.headers import SESSION
from hotseat_common.logging import get_logger
from hotseat_common.messages import WaitReply
from hotseat_common.metrics import RouterMetrics, Series
from hotseat_common.tracing import NO_TRACING, Kind, Tracing
from hotseat_router.activation.protocol import (
    ActivationClient,
    GroupAsk,
    Lease,
    Placed,
    new_attempt,
)
from hotseat_router.activation.scope import LeaseScope
from hotseat_router.attempt import Attempt
from hotseat_router.audit import RequestAudit
from hotseat_router.body import RoutingFields
from hotseat_router.context import RequestContext
from hotseat_router.errors import AllBackendsFailed, DeadlineExceeded, FailClosed
from hotseat_router.headers import upstream_request_headers
from hotseat_router.health import Failure, PassiveHealth
from hotseat_router.matching import GroupRoute, Route
from hotseat_router.rewrite import ModelSlot, with_model
from hotseat_router.upstream import Body, UpstreamClient, UpstreamConnectError, UpstreamResponse

log = get_logger(__name__)

ACQUIRE_GRACE_S = 1.0
"""Extra time an activation client gets past its budget to say so itself."""


@dataclass(frozen=True, slots=True)
class Outbound:
    """The client's request as the walk forwards it."""

    path: str
    body: bytes
    fields: RoutingFields
    model_slot: ModelSlot | None
    """Where ``model`` lies in ``body``, found before the walk when a backend of the
    route renames it."""
    headers: list[tuple[str, str]]
    """The client's end-to-end headers (:func:`~hotseat_router.headers.end_to_end_headers`)."""
    sensitive: bool


@dataclass(slots=True)
class Dispatched:
    """The backend that answered, its response (body unread) and, if pooled, its lease:
    the receiver closes it once the body has been relayed."""

    backend: Backend
    response: UpstreamResponse
    lease: LeaseScope | None


@dataclass(slots=True)
class _Tally:
    withheld: int = 0
    quarantined: int = 0
    failed: int = 0
    busy: list[float | None] = field(default_factory=list)
    queue_full: list[float | None] = field(default_factory=list)
    unavailable: list[float | None] = field(default_factory=list)


def _soonest(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


class Dispatcher:
    def __init__(
        self,
        *,
        policy: RouterPolicy,
        pool_budgets: dict[str, float],
        health: PassiveHealth,
        upstream: UpstreamClient,
        activation: ActivationClient,
        audit: RequestAudit,
        metrics: RouterMetrics,
        router: str,
        bearers: dict[str, str],
        tracing: Tracing = NO_TRACING,
    ) -> None:
        self._tracing = tracing
        self._policy = policy
        self._pool_budgets = pool_budgets
        self._health = health
        self._upstream = upstream
        self._activation = activation
        self._audit = audit
        self._metrics = metrics
        self._attempts = Series(metrics.upstream_attempts)
        self._holds = _HoldSeries(
            router,
            Series(metrics.held),
            Series(metrics.hold_by_priority),
            Series(metrics.pool_hold),
        )
        self._router = router
        self._bearers = bearers

    async def walk(
        self, ctx: RequestContext, route: Route, out: Outbound, deadline: float
    ) -> Dispatched:
        tally = _Tally()
        for backend in route.steps or route.backends:
            if isinstance(backend, GroupRoute):
                placed = await self._try_group(ctx, route, out, deadline, backend, tally)
                if placed is not None:
                    return placed
                continue
            if out.sensitive and backend.tier is not Tier.LOCAL:
                tally.withheld += 1
                continue
            attempt = Attempt.admitted(
                backend, self._health, router=self._router, client=ctx.client
            )
            if attempt is None:
                tally.quarantined += 1
                continue
            dispatched = await self._try(
                ctx, route, out, deadline=deadline, attempt=attempt, tally=tally
            )
            if dispatched is not None:
                return dispatched
        raise _verdict(tally, sensitive=out.sensitive)

    async def _try(
        self,
        ctx: RequestContext,
        route: Route,
        out: Outbound,
        *,
        deadline: float,
        attempt: Attempt,
        tally: _Tally,
    ) -> Dispatched | None:
        """One backend: lease (if pooled), then one attempt. ``None`` means try the next."""
        backend = attempt.backend
        async with attempt:
            if backend.pool is not None:
                lease = await self._lease(ctx, route, attempt, deadline, tally)
                if lease is None:
                    return None
                attempt.lease = LeaseScope(self._activation, lease, ctx.request_id)
            response = await self._send(ctx, route, out, deadline=deadline, attempt=attempt)
            if response is None:
                tally.failed += 1
                return None
            attempt.succeeded()
            return Dispatched(backend=backend, response=response, lease=attempt.hand_on())

    async def _try_group(  # noqa: PLR0917 - the walk's context, as _try has it
        self,
        ctx: RequestContext,
        route: Route,
        out: Outbound,
        deadline: float,
        group: GroupRoute,
        tally: _Tally,
    ) -> Dispatched | None:
        """A model group (docs/adr/0012): placed by the controller, then one attempt on
        the placed backend; a pool whose load failed is left for another placement (its
        backoff keeps it out), up to once per member; so is a pool whose backend this
        router's passive health skips now (quarantined, its trial out), or that failed
        this request (the controller is told to avoid them). ``None`` means the walk goes on."""
        if out.sensitive and any(b.tier is not Tier.LOCAL for b in group.backends.values()):
            tally.withheld += 1
            return None
        avoid = {
            b.pool.name
            for b in group.backends.values()
            if b.pool is not None and self._health.refuses(b.name)
        }
        for _ in group.backends:
            attempt_id = new_attempt(self._router)
            placed = await self._place(
                ctx,
                route,
                group,
                attempt=attempt_id,
                session=_session(out),
                avoid=tuple(sorted(avoid)),
                deadline=deadline,
                tally=tally,
            )
            if placed is None:
                return None
            if placed is _AGAIN:
                continue
            assert isinstance(placed, Placed)  # noqa: S101 - narrowed from the sentinel
            backend = group.backends[placed.backend]
            attempt = Attempt.admitted(
                backend, self._health, router=self._router, client=ctx.client, id=attempt_id
            )
            avoid.add(placed.lease.pool)  # if it does not serve, the next try goes elsewhere
            if attempt is None:
                await self._activation.release(placed.lease, confirm=True)
                tally.quarantined += 1
                continue
            async with attempt:
                attempt.lease = LeaseScope(self._activation, placed.lease, ctx.request_id)
                response = await self._send(ctx, route, out, deadline=deadline, attempt=attempt)
                if response is None:
                    tally.failed += 1
                    continue
                attempt.succeeded()
                return Dispatched(backend=backend, response=response, lease=attempt.hand_on())
        return None

    async def _place(
        self,
        ctx: RequestContext,
        route: Route,
        group: GroupRoute,
        *,
        attempt: str,
        session: str | None,
        avoid: tuple[str, ...],
        deadline: float,
        tally: _Tally,
    ) -> Placed | object | None:
        """The placed lease; ``None``: the group cannot serve now (tallied); ``_AGAIN``:
        the placed pool's load failed, place again."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded("the request deadline passed before a backend answered")
        budgets = [
            self._pool_budgets.get(b.pool.name, remaining)
            for b in group.backends.values()
            if b.pool
        ]
        budget = min(max(budgets, default=remaining), remaining)
        try:
            # Held under the group's name until placed, observed under the pool placed on.
            with self._holding(ctx, group.name, group.name) as hold:
                async with asyncio.timeout(budget + ACQUIRE_GRACE_S):
                    ask = GroupAsk(
                        group.name,
                        route.activation,
                        attempt,
                        ctx.request_id,
                        budget,
                        priority=ctx.priority,
                        session=session,
                        avoid=avoid,
                    )
                    placed = await self._activation.place(
                        ask, lambda reply: ctx.waits_for_swap(reply.swap_id, for_member=True)
                    )
                hold.pool, hold.member = placed.lease.pool, placed.lease.member
        except TimeoutError as exc:
            raise ActivationTimeout(
                f"group {group.name!r} was not placed within {budget:.0f}s"
            ) from exc
        except IncumbentBusy as exc:
            ctx.asks_pool(ctx.pool or group.name, ctx.member or group.name)
            self._audit.busy_skip(
                ctx, backend=group.name, pool=group.name, member=group.name, reason=exc.code
            )
            tally.busy.append(exc.retry_after)
            return None
        except QueueFull as exc:
            tally.queue_full.append(exc.retry_after)
            return None
        except SwapFailed as exc:
            tally.failed += 1
            log.warning(ErrorCode.SWAP_FAILED, group=group.name, error=str(exc))
            return _AGAIN
        except (ControllerUnavailable, UnknownPool) as exc:
            tally.unavailable.append(exc.retry_after)
            log.warning("activation_unavailable", group=group.name, error=str(exc))
            return None
        lease = placed.lease
        ctx.placed(lease.pool, lease.member, placed.reason.value)
        _leased(ctx, lease)
        return placed

    async def _lease(
        self, ctx: RequestContext, route: Route, attempt: Attempt, deadline: float, tally: _Tally
    ) -> Lease | None:
        backend = attempt.backend
        assert backend.pool is not None  # noqa: S101 - only called for pooled backends
        pool, member = backend.pool.name, backend.pool.member
        ctx.asks_pool(pool, member)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded("the request deadline passed before a backend answered")
        budget = min(self._pool_budgets.get(pool, remaining), remaining)
        try:
            with self._holding(ctx, pool, member):
                async with asyncio.timeout(budget + ACQUIRE_GRACE_S):
                    return await self._acquire(
                        ctx, route, attempt, pool=pool, member=member, budget=budget
                    )
        except TimeoutError as exc:
            raise ActivationTimeout(
                f"pool {pool!r} did not make {member!r} resident within {budget:.0f}s"
            ) from exc
        except IncumbentBusy as exc:
            self._audit.busy_skip(
                ctx, backend=backend.name, pool=pool, member=member, reason=exc.code
            )
            tally.busy.append(exc.retry_after)
        except QueueFull as exc:
            tally.queue_full.append(exc.retry_after)
        except SwapFailed as exc:
            tally.failed += 1
            log.warning(ErrorCode.SWAP_FAILED, backend=backend.name, pool=pool, error=str(exc))
        except (ControllerUnavailable, UnknownPool) as exc:
            tally.unavailable.append(exc.retry_after)
            log.warning("activation_unavailable", backend=backend.name, pool=pool, error=str(exc))
        return None

    def _holding(self, ctx: RequestContext, pool: str, member: str) -> _Hold:
        """A request held for a lease, in the hold metrics (:class:`_Hold`)."""
        return _Hold(self._holds, ctx, pool, member)

    async def _acquire(
        self,
        ctx: RequestContext,
        route: Route,
        attempt: Attempt,
        *,
        pool: str,
        member: str,
        budget: float,
    ) -> Lease:
        """The lease; for a held stream answered early, a keep-alive at every interval."""
        span = self._tracing.span(
            spans.ACQUIRE_SPAN, {spans.POOL: pool, spans.MEMBER: member}, kind=Kind.CLIENT
        )
        with span as spanned:
            try:
                return await self._acquire_held(ctx, route, attempt, pool=pool, member=member,
                                                budget=budget)  # fmt: skip
            finally:
                spanned.set(spans.SWAP_ID, ctx.swap_id)

    async def _acquire_held(
        self,
        ctx: RequestContext,
        route: Route,
        attempt: Attempt,
        *,
        pool: str,
        member: str,
        budget: float,
    ) -> Lease:
        held = ctx.held_stream

        def heard(reply: WaitReply) -> None:
            ctx.waits_for_swap(reply.swap_id, for_member=reply.target == member)
            if held is not None:
                held.heard(reply)

        acquire = self._activation.acquire(
            pool=pool,
            member=member,
            mode=route.activation,
            attempt=attempt.id,
            request_id=ctx.request_id,
            budget_s=budget,
            priority=ctx.priority,
            on_wait=heard,
        )
        if held is None:
            return _leased(ctx, await acquire)
        task = asyncio.ensure_future(acquire)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=held.interval)
                if done:
                    return _leased(ctx, task.result())
                await held.tick(member)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _send(
        self, ctx: RequestContext, route: Route, out: Outbound, *, deadline: float, attempt: Attempt
    ) -> UpstreamResponse | None:
        """One upstream request; ``None`` when it failed (the backend is then quarantined)."""
        backend = attempt.backend
        # The per-attempt clock starts here, once any lease is granted: a hold never eats it.
        attempt_s = route.timeout or backend.timeout or self._policy.timeout
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded("the request deadline passed before a backend answered")
        body: Body = out.body
        if backend.model is not None and backend.model != out.fields.model:
            assert out.model_slot is not None  # noqa: S101 - found by the admission
            body = with_model(out.body, out.model_slot, backend.model)
        headers = upstream_request_headers(
            out.headers, request_id=ctx.request_id, bearer=self._bearers.get(backend.name)
        )
        attempts = self._attempts
        try:
            async with asyncio.timeout(min(attempt_s, remaining)):
                response = await self._upstream.send(
                    backend.address + out.path, headers=headers, body=body
                )
        except TimeoutError as exc:
            attempts(self._router, backend.name, "timeout").inc()
            if remaining < attempt_s:
                raise DeadlineExceeded(
                    "the request deadline passed before a backend answered"
                ) from exc
            log.warning("upstream_timeout", backend=backend.name, timeout_s=attempt_s)
            await _failed(attempt, "timeout")
            return None
        except UpstreamConnectError as exc:
            attempts(self._router, backend.name, "connect").inc()
            log.warning("upstream_unreachable", backend=backend.name, error=str(exc))
            await _failed(attempt, "connect")
            return None
        if response.status >= 500:
            attempts(self._router, backend.name, "http_5xx").inc()
            response.close()
            log.warning("upstream_5xx", backend=backend.name, status=response.status)
            await _failed(attempt, None)
            return None
        result = "ok" if response.status < 400 else "http_4xx"
        attempts(self._router, backend.name, result).inc()
        return response


class _HoldSeries(NamedTuple):
    router: str
    held: Series[Gauge]
    by_priority: Series[Histogram]
    by_result: Series[Histogram]


class _Hold:
    """A request held for a lease, in the hold metrics (a context manager): the held
    gauge under ``pool`` and ``member`` while it lasts, then its hold observed under the
    pool and member it ended on (a model group's placement sets them) with its result
    (``granted``, or what the exception that ended it tells). A class rather than a
    generator: a pooled request on a shared lease enters one, so it is on the hot path."""

    __slots__ = ("_ctx", "_gauge", "_series", "_started", "member", "pool", "result")

    def __init__(self, series: _HoldSeries, ctx: RequestContext, pool: str, member: str) -> None:
        self._series = series
        self._ctx = ctx
        self.pool = pool
        self.member = member
        self.result = "granted"
        self._gauge = series.held(series.router, pool, member)
        self._started = 0.0

    def __enter__(self) -> Self:
        self._gauge.inc()
        self._started = time.monotonic()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, _tb: object
    ) -> None:
        if exc is not None:
            self.result = _hold_result(exc)
        self._gauge.dec()
        seconds = time.monotonic() - self._started
        ctx, series = self._ctx, self._series
        ctx.held_for(seconds)
        series.by_priority(series.router, self.pool, str(ctx.priority)).observe(seconds)
        series.by_result(series.router, self.pool, self.member, self.result).observe(seconds)


def _hold_result(exc: BaseException) -> str:
    """The ``result`` label of a hold an exception ended."""
    if isinstance(exc, (TimeoutError, ActivationTimeout)):
        return "timeout"
    if isinstance(exc, IncumbentBusy):
        return "busy"
    if isinstance(exc, QueueFull):
        return "queue_full"
    if isinstance(exc, SwapFailed):
        return ErrorCode.SWAP_FAILED
    if isinstance(exc, (ControllerUnavailable, UnknownPool)):
        return "unavailable"
    return "cancelled"


_AGAIN = object()
"""A placement whose pool failed its load: the group is asked again."""


def _session(out: Outbound) -> str | None:
    """The conversation a model group keeps on one pool: ``x-hotseat-session``, else the
    OpenAI ``user`` field."""
    for name, value in out.headers:
        if name.lower() == SESSION and value:
            return value
    return out.fields.user


def _leased(ctx: RequestContext, lease: Lease) -> Lease:
    ctx.waits_for_swap(lease.swap_id, for_member=True)
    return lease


async def _failed(attempt: Attempt, connection_failure: str | None) -> None:
    """The backend failed this try: quarantined, and a pool member that could not be
    reached at all is reported to the controller (which checks the resident)."""
    attempt.failed(Failure.UNREACHABLE if connection_failure == "connect" else Failure.ANSWERED)
    if attempt.lease is not None and connection_failure is not None:
        await attempt.lease.report_failure(connection_failure)


def _verdict(tally: _Tally, *, sensitive: bool) -> Exception:
    """The error a walk that served nothing ends with."""
    if sensitive and tally.withheld:
        return FailClosed(
            "the request's classification allows only local backends and none could serve it",
            reason="classification",
        )
    if tally.unavailable:
        return ControllerUnavailable(
            "the pool controller could not vouch for any pooled backend",
            retry_after=_soonest(tally.unavailable),
        )
    if tally.busy and not (tally.failed or tally.queue_full):
        return IncumbentBusy(
            "every backend's pool is busy serving another model; retry shortly",
            retry_after=_soonest(tally.busy),
        )
    if tally.queue_full:
        return QueueFull(
            "the pool's wait queue is full; retry shortly",
            retry_after=_soonest(tally.queue_full + tally.busy),
        )
    if tally.failed == 0 and tally.quarantined:
        return AllBackendsFailed(
            "every backend of the route is quarantined after recent failures",
            reason="quarantined",
        )
    return AllBackendsFailed("no backend of the route could serve the request")
