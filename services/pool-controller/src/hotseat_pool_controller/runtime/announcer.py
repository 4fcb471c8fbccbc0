"""What the controller tells the world: state-change notifications on NATS (routers
waiting on a pool re-ask), audit events, and (through :class:`~.counting.Counting`)
metrics. The runtime says what happened here; this is its only door to the outside."""

from __future__ import annotations

from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError

from hotseat_common.audit_stream import AuditPublisher
from hotseat_common.logging import get_logger
from hotseat_common.messages import PoolOutcome, PoolStateChanged, pool_event
from hotseat_common.metrics import PoolMetrics
from hotseat_common.subjects import Subjects
from hotseat_pool_controller.drivers.base import CacheReport
from hotseat_pool_controller.model import IN_FLIGHT, AuditIntent, PoolSnapshot
from hotseat_pool_controller.runtime.counting import Counting
from hotseat_pool_controller.store.pool import ExpiredLease

log = get_logger(__name__)


def state_message(pool: str, snap: PoolSnapshot, reason: str) -> PoolStateChanged:
    """The state-change notification that names ``snap``."""
    return PoolStateChanged(
        pool=pool,
        epoch=snap.epoch,
        phase=snap.phase.value,
        resident=snap.resident,
        target=snap.target,
        reason=reason,
        closed=True if snap.closed else None,
        closing=sorted(snap.closing) or None,
        swap_id=snap.swap_id if snap.phase in IN_FLIGHT else None,
    )


class Announcer:
    def __init__(
        self,
        nc: NatsClient,
        subjects: Subjects,
        audit: AuditPublisher,
        metrics: PoolMetrics,
        controller: str,
    ) -> None:
        self._nc = nc
        self._subjects = subjects
        self._audit = audit
        self._count = Counting(metrics)
        self.controller = controller

    async def state_changed(self, pool: str, snap: PoolSnapshot, reason: str) -> None:
        """Publish ``snap`` (the pool as a commit left it) to the routers, and count it."""
        message = state_message(pool, snap, reason)
        try:
            await self._nc.publish(self._subjects.pool_events(pool), message.to_bytes())
        except NatsError as exc:
            # Waiting routers also re-ask on a timer; a lost notification only delays them.
            log.warning("pool_event_publish_failed", pool=pool, error=type(exc).__name__)
        self._count.observe(pool, snap)

    def observe(self, pool: str, snap: PoolSnapshot, free_gib: float | None = None) -> None:
        """A pool as just read: its gauges (leases, waiters, residents, a capacity pool's
        free memory)."""
        self._count.observe(pool, snap, free_gib)

    def acquired(self, pool: str, member: str, status: str) -> None:
        self._count.acquired(pool, member, status)

    def swap_ran(self, pool: str, target: str, result: str, seconds: float) -> None:
        self._count.swap_ran(pool, target, result, seconds)

    def relearned(self, pool: str) -> None:
        """The pool's state was rebuilt after the store lost it."""
        self._count.relearned(pool)

    def unhealthy(self, pool: str, member: str) -> None:
        """The resident was marked unhealthy while it serves."""
        self._count.unhealthy(pool, member)

    def cache_step(self, pool: str, report: CacheReport) -> None:
        """A member's prompt cache saved or restored (or not): logged and counted."""
        self._count.cache_step(pool, report)
        fields = {
            "pool": pool,
            "member": report.member,
            "slots": report.slots,
            "tokens": report.tokens,
            "bytes": report.bytes,
            "seconds": round(report.seconds, 3),
            "dropped_stale": report.dropped_stale,
            "dropped_budget": report.dropped_budget,
            "note": report.note,
        }
        event = "cache_saved" if report.action == "save" else "cache_restored"
        if not report.failures:
            log.info(event, **fields)
            return
        failures = [
            {"reason": f.reason.value, "slot": f.slot, "detail": f.detail} for f in report.failures
        ]
        log.warning(event, failures=failures, **fields)

    def transition(self, pool: str, intent: AuditIntent) -> None:
        """A transition a decision made: audited and counted."""
        self.audit(pool, intent)
        self._count.transition(pool, intent)

    def lease_expired(self, pool: str, lease: ExpiredLease) -> None:
        self._count.lease_expired(pool, lease.member)
        self.audit(
            pool,
            AuditIntent(
                PoolOutcome.LEASE_EXPIRED,
                member=lease.member,
                request_id=lease.request_id,
                reason=f"not renewed by router {lease.router}",
            ),
        )

    def audit(self, pool: str, intent: AuditIntent) -> None:
        about: dict[str, object] = {
            "pool": pool,
            "member": intent.member,
            "from_member": intent.from_member,
            "to_member": intent.to_member,
            "epoch": intent.epoch,
            "reason": intent.reason,
            "swap_id": intent.swap_id,
            "unload_ms": intent.unload_ms,
            "load_ms": intent.load_ms,
        }
        if intent.evicts:
            about["evicts"] = ",".join(intent.evicts)
        if intent.also:
            about["also"] = ",".join(intent.also)
        if intent.cache is not None:
            about |= {
                "cache_saved_bytes": intent.cache.saved_bytes,
                "cache_saved_tokens": intent.cache.saved_tokens,
                "cache_save_ms": round(intent.cache.save_ms, 3),
                "cache_restored_bytes": intent.cache.restored_bytes,
                "cache_restored_tokens": intent.cache.restored_tokens,
                "cache_restore_ms": round(intent.cache.restore_ms, 3),
            }
        if intent.event_id is not None:
            about["id"] = intent.event_id
        self._audit.emit(
            pool_event(
                intent.outcome, controller=self.controller, request_id=intent.request_id, **about
            )
        )
        log.info("pool_event", outcome=intent.outcome.value, **about)
