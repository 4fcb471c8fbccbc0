"""The JetStream stream that carries audit events, and the publisher every service uses.

Publishing never blocks a request: events go into a bounded buffer and a background task
publishes them with a publish ack and ``Nats-Msg-Id`` = event id, retrying the same id
until JetStream acknowledges it (the stream's de-dup window makes the retry harmless).
When the buffer is full an event is dropped, counted and logged, never silently lost.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from hotseat_common.logging import get_logger
from hotseat_common.messages.audit import AuditEvent
from hotseat_common.metrics import AuditPublishMetrics
from hotseat_common.subjects import Subjects

log = get_logger(__name__)

PUBLISH_TIMEOUT = 2.0
RETRY_BACKOFF_MAX = 2.0


@dataclass(frozen=True, slots=True)
class AuditStreamSpec:
    name: str
    subjects: Subjects
    max_age_s: float = 30 * 24 * 3600
    max_bytes: int = -1
    duplicate_window_s: float = 120.0

    def config(self) -> StreamConfig:
        return StreamConfig(
            name=self.name,
            subjects=[self.subjects.audit_all],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            discard=DiscardPolicy.OLD,
            max_age=self.max_age_s,
            max_bytes=self.max_bytes,
            duplicate_window=self.duplicate_window_s,
        )


async def ensure_audit_stream(
    js: JetStreamContext, spec: AuditStreamSpec, *, update: bool = False
) -> None:
    """Create the stream if missing; with ``update`` also apply changed limits."""
    try:
        await js.stream_info(spec.name)
    except NotFoundError:
        await js.add_stream(spec.config())
        log.info("audit_stream_created", stream=spec.name)
        return
    if update:
        await js.update_stream(spec.config())


class AuditPublisher:
    """Buffers audit events and publishes them to JetStream in the background."""

    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        metrics: AuditPublishMetrics,
        *,
        max_buffer: int = 10_000,
    ) -> None:
        self._js = js
        self._subjects = subjects
        self._metrics = metrics
        self._queue: asyncio.Queue[AuditEvent] = asyncio.Queue(maxsize=max_buffer)
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def emit(self, event: AuditEvent) -> None:
        """Queue ``event`` for publishing; never blocks."""
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self._metrics.dropped.inc()
            log.error(  # noqa: TRY400 - a full buffer is the whole story, no traceback
                "audit_event_dropped",
                event_id=event.id,
                outcome=event.outcome,
                reason="buffer_full",
            )
            return
        self._idle.clear()
        self._metrics.buffered.set(self._queue.qsize())

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="audit-publisher")

    async def _run(self) -> None:
        while True:
            event = await self._queue.get()
            await self._publish_until_acked(event)
            self._queue.task_done()
            self._metrics.buffered.set(self._queue.qsize())
            if self._queue.empty():
                self._idle.set()

    async def _publish_until_acked(self, event: AuditEvent) -> None:
        subject = self._subjects.audit(event.kind, event.outcome)
        data = event.to_bytes()
        backoff = 0.05
        while True:
            try:
                await self._js.publish(
                    subject, data, timeout=PUBLISH_TIMEOUT, headers={"Nats-Msg-Id": event.id}
                )
            except (NatsError, TimeoutError) as exc:
                log.warning(
                    "audit_publish_retry",
                    event_id=event.id,
                    error=type(exc).__name__,
                    backoff=backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RETRY_BACKOFF_MAX)
            else:
                self._metrics.published.inc()
                return

    async def flush(self, timeout: float) -> bool:
        """Wait until every queued event is acknowledged; False if ``timeout`` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def close(self, timeout: float) -> None:
        """Flush, then stop; events still queued after ``timeout`` are counted as dropped."""
        flushed = await self.flush(timeout)
        if not flushed:
            left = self._queue.qsize()
            self._metrics.dropped.inc(left)
            log.error("audit_events_unflushed", count=left)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
