"""The JetStream stream that carries audit events, and the publisher every service uses.

Publishing never blocks a request: an event is encoded and appended to a bounded buffer,
and a background task publishes what the buffer holds in batches: every event of a batch
goes out at once as a message of its own (``Nats-Msg-Id`` = event id, each with its own
publish ack), then the task waits for the batch's acks together. The acks come back on
one subscription of the publisher (:class:`_AckInbox`, a reply subject per message)
rather than a future per message: that halves what an event costs the process that
publishes it (docs/adr/0002). A batch is taken ``linger`` seconds after
the first event of it arrived (unless a full batch is already waiting), so that under
load one wake-up, socket write and ack wait serve many events instead of one or two.
An event stays in the publisher until JetStream acknowledged it; one whose ack did not
come is published again under the same id (the stream's de-dup window makes the retry
harmless). When the buffer is full an event is dropped, counted and logged, never
silently lost.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, Header, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from hotseat_common.logging import get_logger
from hotseat_common.messages.audit import AuditEvent
from hotseat_common.metrics import AuditPublishMetrics
from hotseat_common.subjects import Subjects

log = get_logger(__name__)

PUBLISH_TIMEOUT = 2.0
RETRY_BACKOFF_MAX = 2.0
MAX_BATCH = 256
"""At most this many events are published before their acks are awaited."""
LINGER_S = 0.01
"""How long the publisher lets events gather before it takes a batch: events reach the
stream at most this much later, and a busy router wakes its publisher, writes to NATS
and waits for acks once per many events (docs/benchmarks.md, Router: 4 to 6% less CPU
per request at 8 connections, none at 64, where batches were large already)."""


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


class _Pending(NamedTuple):
    subject: str
    event_id: str
    data: bytes


def _acknowledged(reply: bytes) -> bool:
    """Whether a reply to a publish is JetStream's ack that the stream holds the message
    (``{"stream": ..., "seq": ...}``, a duplicate included), not an error or a status."""
    try:
        ack = orjson.loads(reply)
    except orjson.JSONDecodeError:
        return False  # e.g. the empty body of a 503 "no responders": no stream took it
    return isinstance(ack, dict) and "seq" in ack and "error" not in ack


class _Attempt:
    """One publish of a batch: its messages' reply subjects and which were acknowledged."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = replies
        self.index = {reply: index for index, reply in enumerate(replies)}
        self.acked = [False] * len(replies)
        self.answered = 0
        self.expected = len(replies)
        self.complete: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.refused: bytes | None = None
        """The first reply that was not an ack, for the log."""

    def answer(self, msg: Msg) -> None:
        index = self.index.pop(msg.subject, None)
        if index is None:
            return
        acked = self.acked[index] = _acknowledged(msg.data)
        if not acked and self.refused is None:
            self.refused = msg.data[:200] or repr(msg.headers).encode()
        self.answered += 1
        self._check()

    def _check(self) -> None:
        if self.answered >= self.expected and not self.complete.done():
            self.complete.set_result(None)

    async def wait(self, sent: int, timeout: float) -> list[bool]:
        """Wait until the first ``sent`` messages are answered, or ``timeout``; per message,
        whether JetStream acknowledged it."""
        self.expected = sent
        self._check()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.complete), timeout)
        self.index.clear()  # a reply from now on is late: its message counts as not acked
        return self.acked


class _AckInbox:
    """One subscription for every publish ack of a publisher: each message is sent with a
    reply subject of its own (``<inbox>.<n>``, never reused), and the replies are matched
    to the messages of the attempt in progress; a reply to an earlier attempt, late, is
    ignored (that attempt's message was already counted as not acknowledged)."""

    def __init__(self, nc: NatsClient) -> None:
        self._nc = nc
        self._prefix = ""
        self._sub: Subscription | None = None
        self._next = 0
        self._attempt: _Attempt | None = None

    async def open(self) -> None:
        if self._sub is None:
            self._prefix = self._nc.new_inbox()
            self._sub = await self._nc.subscribe(f"{self._prefix}.*", cb=self._on_reply)

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(NatsError):
                await sub.unsubscribe()

    def begin(self, count: int) -> _Attempt:
        """Start an attempt of ``count`` messages, with reply subjects never used before."""
        first = self._next
        self._next += count
        self._attempt = _Attempt([f"{self._prefix}.{n}" for n in range(first, first + count)])
        return self._attempt

    async def _on_reply(self, msg: Msg) -> None:
        if self._attempt is not None:
            self._attempt.answer(msg)


class AuditPublisher:
    """Buffers audit events and publishes them to JetStream in the background, in batches."""

    def __init__(
        self,
        nc: NatsClient,
        subjects: Subjects,
        metrics: AuditPublishMetrics,
        *,
        max_buffer: int = 10_000,
        max_batch: int = MAX_BATCH,
        linger: float = LINGER_S,
    ) -> None:
        self._nc = nc
        self._acks = _AckInbox(nc)
        self._subjects = subjects
        self._metrics = metrics
        self._max_buffer = max_buffer
        self._max_batch = max_batch
        self._linger = linger
        self._buffer: deque[_Pending] = deque()
        self._in_flight = 0
        """Events taken from the buffer whose acks the task still waits for."""
        self._routes: dict[tuple[str, str], str] = {}
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    def emit(self, event: AuditEvent) -> None:
        """Queue ``event`` for publishing; never blocks."""
        self.emit_encoded(event.kind, event.outcome, event.id, event.to_bytes())

    def emit_encoded(self, kind: str, outcome: str, event_id: str, data: bytes) -> None:
        """Queue an event already encoded (:func:`~hotseat_common.messages.audit.encode_event`)."""
        if len(self._buffer) + self._in_flight >= self._max_buffer:
            self._metrics.dropped.inc()
            log.error(
                "audit_event_dropped", event_id=event_id, outcome=outcome, reason="buffer_full"
            )
            return
        subject = self._routes.get((kind, outcome))
        if subject is None:
            subject = self._routes[kind, outcome] = self._subjects.audit(kind, outcome)
        self._buffer.append(_Pending(subject, event_id, data))
        if not self._ready.is_set():
            self._idle.clear()
            self._ready.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="audit-publisher")

    async def _run(self) -> None:
        buffer = self._buffer
        while True:
            if not buffer:
                self._metrics.buffered.set(0)
                self._idle.set()
                self._ready.clear()
                await self._ready.wait()
            if self._linger > 0 and len(buffer) < self._max_batch:
                await asyncio.sleep(self._linger)
            take = min(len(buffer), self._max_batch)
            batch = [buffer.popleft() for _ in range(take)]
            self._in_flight = take
            self._metrics.buffered.set(take + len(buffer))
            try:
                await self._publish_until_acked(batch)
            finally:
                self._in_flight = 0

    async def _publish_until_acked(self, batch: list[_Pending]) -> None:
        backoff = 0.05
        while batch:
            batch = await self._publish_once(batch)
            if batch:
                log.warning(
                    "audit_publish_retry",
                    event_id=batch[0].event_id,
                    events=len(batch),
                    backoff=backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RETRY_BACKOFF_MAX)

    async def _publish_once(self, batch: list[_Pending]) -> list[_Pending]:
        """Publish every event of ``batch``, then wait for their acks together; the events
        whose ack did not come (or said no) are returned, to be published again."""
        acked: list[bool] = []
        sent = 0
        try:
            await self._acks.open()
            attempt = self._acks.begin(len(batch))
            for item, reply in zip(batch, attempt.replies, strict=True):
                await self._nc.publish(
                    item.subject, item.data, reply=reply, headers={Header.MSG_ID: item.event_id}
                )
                sent += 1  # counted one by one: a failure keeps those sent
        except (NatsError, OSError) as exc:
            log.warning("audit_publish_failed", error=type(exc).__name__)
        if sent:
            self._metrics.batches.inc()
            acked = await attempt.wait(sent, PUBLISH_TIMEOUT)
            if attempt.refused is not None:
                log.warning("audit_publish_refused", reply=repr(attempt.refused))
        failed = [item for item, ok in zip(batch, acked, strict=False) if not ok]
        failed.extend(batch[len(acked) :])
        if len(batch) > len(failed):
            self._metrics.published.inc(len(batch) - len(failed))
        return failed

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
            left = len(self._buffer) + self._in_flight
            self._metrics.dropped.inc(left)
            log.error("audit_events_unflushed", count=left)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._acks.close()
