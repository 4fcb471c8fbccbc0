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
from hotseat_pool_controller.model import AuditIntent, PoolSnapshot
from hotseat_pool_controller.runtime.counting import Counting
from hotseat_pool_controller.store.pool import ExpiredLease

log = get_logger(__name__)


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
        message = PoolStateChanged(
            pool=pool,
            epoch=snap.epoch,
            phase=snap.phase.value,
            resident=snap.resident,
            target=snap.target,
            reason=reason,
            closed=True if snap.closed else None,
        )
        try:
            await self._nc.publish(self._subjects.pool_events(pool), message.to_bytes())
        except NatsError as exc:
            # Waiting routers also re-ask on a timer; a lost notification only delays them.
            log.warning("pool_event_publish_failed", pool=pool, error=type(exc).__name__)
        self._count.observe(pool, snap)

    def observe(self, pool: str, snap: PoolSnapshot) -> None:
        """A pool as just read: its gauges (leases, waiters, resident)."""
        self._count.observe(pool, snap)

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
        about = {
            "pool": pool,
            "member": intent.member,
            "from_member": intent.from_member,
            "to_member": intent.to_member,
            "epoch": intent.epoch,
            "reason": intent.reason,
        }
        self._audit.emit(
            pool_event(
                intent.outcome, controller=self.controller, request_id=intent.request_id, **about
            )
        )
        log.info("pool_event", outcome=intent.outcome.value, **about)
