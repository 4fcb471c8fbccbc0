"""Audit emission: exactly one terminal ``kind: request`` event per request, plus
``busy_skip`` pool events, published through :class:`AuditPublisher` (never blocking).

The request counters and duration histogram are updated here too, so that every
outcome the audit trail sees is also counted.

The request event is encoded straight from the request's typed record
(:func:`~hotseat_common.messages.audit.encode_event`) and handed to the publisher, which
publishes it in a batch off the request's path.
"""

from __future__ import annotations

from hotseat_common.audit_stream import AuditPublisher
from hotseat_common.messages.audit import PoolOutcome, RequestOutcome, encode_event, pool_event
from hotseat_common.metrics import RouterMetrics, Series
from hotseat_router.access_log import access_line
from hotseat_router.context import RequestContext
from hotseat_router.matching import DEFAULT_ROUTE


class RequestAudit:
    def __init__(
        self,
        publisher: AuditPublisher,
        metrics: RouterMetrics,
        router: str,
        *,
        access_log: bool = False,
    ) -> None:
        self._publisher = publisher
        self._metrics = metrics
        self._router = router
        self._access_log = access_log
        self._tokens = Series(metrics.tokens)
        self._requests = Series(metrics.requests)
        self._durations = Series(metrics.request_duration)

    def finish(
        self,
        ctx: RequestContext,
        outcome: RequestOutcome,
        *,
        status: int | None = None,
        reason: str | None = None,
    ) -> None:
        """Record the request's terminal outcome; later calls for the same request do nothing."""
        if not ctx.finish_once():
            return
        ctx.outcome = outcome.value
        elapsed = ctx.elapsed()
        duration_ms = round(elapsed * 1000, 3)
        status = status if status is not None else ctx.status
        rule_label = ctx.rule if ctx.rule is not None else DEFAULT_ROUTE
        self._requests(self._router, rule_label, ctx.backend or "", outcome.value).inc()
        self._durations(self._router, rule_label, outcome.value).observe(elapsed)
        usage = ctx.usage
        if usage is not None:
            labels = (self._router, rule_label, ctx.backend or "", ctx.api_key or "")
            self._tokens(*labels, "prompt").inc(usage.prompt_tokens)
            self._tokens(*labels, "completion").inc(usage.completion_tokens)
        event_id, data = encode_event(
            "request",
            outcome.value,
            {
                "request_id": ctx.request_id,
                "router": self._router,
                "rule": ctx.rule,
                "backend": ctx.backend,
                "pool": ctx.pool,
                "member": ctx.member,
                "status": status,
                "duration_ms": duration_ms,
                "reason": reason,
                "swap_id": ctx.swap_id,
                "prompt_tokens": usage.prompt_tokens if usage is not None else None,
                "completion_tokens": usage.completion_tokens if usage is not None else None,
                "api_key": ctx.api_key,
                "placement": ctx.placement,
            },
        )
        self._publisher.emit_encoded("request", outcome.value, event_id, data)
        if self._access_log:
            access_line(ctx, outcome, status=status, duration_ms=duration_ms, reason=reason)

    def busy_skip(
        self, ctx: RequestContext, *, backend: str, pool: str, member: str, reason: str
    ) -> None:
        self._metrics.busy_skips.labels(self._router, pool, member).inc()
        self._publisher.emit(
            pool_event(
                PoolOutcome.BUSY_SKIP,
                request_id=ctx.request_id,
                router=self._router,
                rule=ctx.rule,
                backend=backend,
                pool=pool,
                member=member,
                reason=reason,
            )
        )
