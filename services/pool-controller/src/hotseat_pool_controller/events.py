"""What the controller tells the world after a transition: state-change notifications on
NATS (routers waiting on a pool re-ask), audit events, and metrics."""

from __future__ import annotations

from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError

from hotseat_common.audit_stream import AuditPublisher
from hotseat_common.logging import get_logger
from hotseat_common.messages import PoolStateChanged, pool_event
from hotseat_common.metrics import PoolMetrics
from hotseat_common.subjects import Subjects
from hotseat_pool_controller.decisions.model import AuditIntent, PoolSnapshot

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
        self.metrics = metrics
        self.controller = controller

    async def state_changed(self, pool: str, snap: PoolSnapshot, reason: str) -> None:
        message = PoolStateChanged(
            pool=pool,
            epoch=snap.epoch,
            phase=snap.phase.value,
            resident=snap.resident,
            target=snap.target,
            reason=reason,
        )
        try:
            await self._nc.publish(self._subjects.pool_events(pool), message.to_bytes())
        except NatsError as exc:
            # Waiting routers also re-ask on a timer; a lost notification only delays them.
            log.warning("pool_event_publish_failed", pool=pool, error=type(exc).__name__)
        self.observe(pool, snap)

    def observe(self, pool: str, snap: PoolSnapshot) -> None:
        """Refresh the gauges from a snapshot."""
        for member, count in snap.leases.items():
            self.metrics.leases_live.labels(pool, member).set(count)
            self.metrics.resident.labels(pool, member).set(1 if member == snap.resident else 0)
        for member, count in snap.waiters.items():
            self.metrics.waiters.labels(pool, member).set(count)

    def audit(self, pool: str, intent: AuditIntent) -> None:
        self._audit.emit(
            pool_event(
                intent.outcome,
                controller=self.controller,
                pool=pool,
                member=intent.member,
                from_member=intent.from_member,
                to_member=intent.to_member,
                epoch=intent.epoch,
                reason=intent.reason,
                request_id=intent.request_id,
            )
        )
        log.info(
            "pool_event",
            outcome=intent.outcome.value,
            pool=pool,
            member=intent.member,
            from_member=intent.from_member,
            to_member=intent.to_member,
            epoch=intent.epoch,
            reason=intent.reason,
        )
