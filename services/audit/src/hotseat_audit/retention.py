"""The retention job: delete events (and dead letters) older than the configured age.

Deletes run in batches of ``batch`` rows so a large backlog never holds a long lock or
a long transaction; the job yields between batches so ingest keeps flowing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from hotseat_audit.store import AuditStore, StoreError
from hotseat_common.logging import get_logger
from hotseat_common.metrics import AuditMetrics

log = get_logger(__name__)


def _utcnow() -> datetime:
    return datetime.now(UTC)


class RetentionJob:
    def __init__(
        self,
        store: AuditStore,
        metrics: AuditMetrics,
        *,
        max_age: float,
        interval: float,
        batch: int,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._max_age = timedelta(seconds=max_age)
        self._interval = interval
        self._batch = batch
        self._clock = clock
        self._stopping = asyncio.Event()
        self.deleted = 0

    @property
    def enabled(self) -> bool:
        return self._max_age > timedelta(0)

    async def run_once(self) -> int:
        """Delete everything older than the cutoff, one batch at a time."""
        cutoff = self._clock() - self._max_age
        total = 0
        while not self._stopping.is_set():
            deleted = await self._store.delete_older_than(cutoff, limit=self._batch)
            total += deleted
            self._metrics.retention_deleted.inc(deleted)
            if deleted < self._batch:
                break
            await asyncio.sleep(0)  # let ingest and queries in between batches
        if total:
            self.deleted += total
            await self._store.optimize()
            log.info("audit_retention_deleted", rows=total, cutoff=cutoff.isoformat())
        return total

    async def run(self) -> None:
        """Run at start-up and then every ``interval`` until stopped."""
        if not self.enabled:
            log.info("audit_retention_disabled")
            return
        while not self._stopping.is_set():
            try:
                await self.run_once()
            except StoreError as exc:
                log.warning("audit_retention_failed", error=str(exc))
            try:
                await asyncio.wait_for(self._stopping.wait(), self._interval)
            except TimeoutError:
                continue

    def stop(self) -> None:
        self._stopping.set()
