"""The controller's metrics for its pools: every count and duration in one place, so the
rest of the runtime says what happened and never touches a metric."""

from __future__ import annotations

from hotseat_common.messages import PoolOutcome
from hotseat_common.metrics import PoolMetrics
from hotseat_pool_controller.drivers.base import CacheReport
from hotseat_pool_controller.model import AuditIntent, PoolSnapshot

_SWAP_RESULTS = {
    PoolOutcome.SWAP_COMPLETED: "completed",
    PoolOutcome.SWAP_FAILED: "failed",
    PoolOutcome.SWAP_CANCELLED: "cancelled",
}


class Counting:
    def __init__(self, metrics: PoolMetrics) -> None:
        self._metrics = metrics

    def acquired(self, pool: str, member: str, status: str) -> None:
        self._metrics.acquires.labels(pool, member, status).inc()

    def transition(self, pool: str, intent: AuditIntent) -> None:
        """A swap that started or ended, or a resident lost."""
        result = _SWAP_RESULTS.get(intent.outcome)
        if result is not None:
            self._metrics.swaps.labels(
                pool, intent.from_member or "", intent.to_member or "", result
            ).inc()
        if intent.outcome == PoolOutcome.SWAP_STARTED:
            self._metrics.swaps_started.labels(
                pool, intent.to_member or "", intent.reason or ""
            ).inc()
        if intent.outcome == PoolOutcome.SWAP_RETARGETED:
            self._metrics.swap_retargets.labels(
                pool, intent.from_member or "", intent.to_member or ""
            ).inc()
        if intent.outcome == PoolOutcome.RESIDENT_LOST:
            self._metrics.residents_lost.labels(pool, intent.member or "").inc()

    def lease_expired(self, pool: str, member: str) -> None:
        self._metrics.lease_expiries.labels(pool, member).inc()

    def swap_ran(self, pool: str, target: str, result: str, seconds: float) -> None:
        self._metrics.swap_duration.labels(pool, target, result).observe(seconds)

    def relearned(self, pool: str) -> None:
        self._metrics.store_relearns.labels(pool).inc()

    def unhealthy(self, pool: str, member: str) -> None:
        self._metrics.residents_unhealthy.labels(pool, member).inc()

    def cache_step(self, pool: str, report: CacheReport) -> None:
        """A member's prompt-cache save or restore (docs/adr/0007)."""
        member, action = report.member, report.action
        self._metrics.cache_bytes.labels(pool, member, action).inc(report.bytes)
        self._metrics.cache_tokens.labels(pool, member, action).inc(report.tokens)
        self._metrics.cache_duration.labels(pool, member, action).observe(report.seconds)
        for failure in report.failures:
            self._metrics.cache_failures.labels(pool, member, action, failure.reason).inc()
        for reason, count in (("stale", report.dropped_stale), ("budget", report.dropped_budget)):
            if count:
                self._metrics.cache_files_dropped.labels(pool, member, reason).inc(count)

    def observe(self, pool: str, snap: PoolSnapshot, free_gib: float | None = None) -> None:
        """Refresh the gauges from a snapshot (``free_gib``: a capacity pool's)."""
        for member, count in snap.leases.items():
            self._metrics.leases_live.labels(pool, member).set(count)
            resident = member == snap.resident or member in snap.residents
            self._metrics.resident.labels(pool, member).set(1 if resident else 0)
        if free_gib is not None:
            self._metrics.memory_free.labels(pool).set(free_gib)
        for member, count in snap.waiters.items():
            self._metrics.waiters.labels(pool, member).set(count)
