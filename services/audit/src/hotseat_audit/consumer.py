"""The durable pull consumer that moves audit events from JetStream into the store.

One batch at a time: fetch up to ``batch_size`` messages, decode each into an event or a
dead letter, commit the whole batch in one transaction, and only then acknowledge every
message. A crash anywhere before the acks leaves the messages unacknowledged, so
JetStream redelivers them after ``ack_wait``; the store skips ids it already holds, so a
redelivery never makes a second row. A message that is not a valid event is stored as a
dead letter and acknowledged like any other, so it never blocks the ones behind it.

Several replicas may share the durable consumer: JetStream spreads batches over them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from hotseat_audit.decoding import DeadLetter, Incoming, Origin, decode
from hotseat_audit.store import AuditStore, StoreError, WriteResult
from hotseat_common.logging import get_logger
from hotseat_common.metrics import AuditMetrics

log = get_logger(__name__)

FETCH_TIMEOUT = 1.0
"""How long one fetch waits for messages; also bounds how long a stop request waits."""
LAG_REFRESH = 5.0
RETRY_BACKOFF_MAX = 5.0
API_TIMEOUT = 5.0


@dataclass(slots=True)
class Tally:
    """What this process did, for the shutdown log line."""

    batches: int = 0
    stored: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    store_errors: int = 0

    def add(self, result: WriteResult) -> None:
        self.batches += 1
        self.stored += result.stored.total()
        self.duplicates += result.duplicates
        self.dead_letters += result.dead_letters.total()


class AuditConsumer:
    """Fetches, stores and acknowledges audit events until stopped."""

    def __init__(
        self,
        js: JetStreamContext,
        store: AuditStore,
        metrics: AuditMetrics,
        *,
        stream: str,
        consumer: str,
        filter_subject: str,
        batch_size: int,
        ack_wait: float,
    ) -> None:
        self._js = js
        self._store = store
        self._metrics = metrics
        self._stream = stream
        self._consumer = consumer
        self._filter = filter_subject
        self._batch_size = batch_size
        self._ack_wait = ack_wait
        self._sub: JetStreamContext.PullSubscription | None = None
        self._stopping = asyncio.Event()
        self._lag_checked = 0.0
        self.tally = Tally()

    @property
    def subscribed(self) -> bool:
        return self._sub is not None

    def consumer_config(self) -> ConsumerConfig:
        return ConsumerConfig(
            name=self._consumer,
            durable_name=self._consumer,
            description="hotseat-audit: stores every audit event once",
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self._ack_wait,
            max_deliver=-1,
            filter_subject=self._filter,
            max_ack_pending=max(4 * self._batch_size, 1000),
        )

    async def subscribe(self) -> None:
        """Create the durable consumer, or update its settings, and bind to it."""
        await self._js.add_consumer(self._stream, self.consumer_config(), timeout=API_TIMEOUT)
        self._sub = await self._js.pull_subscribe_bind(durable=self._consumer, stream=self._stream)
        log.info(
            "audit_consumer_bound",
            stream=self._stream,
            consumer=self._consumer,
            batch_size=self._batch_size,
            ack_wait=self._ack_wait,
        )

    def stop(self) -> None:
        """Stop fetching; the batch in hand is still committed and acknowledged."""
        self._stopping.set()

    async def close(self) -> None:
        """Remove the subscription's inbox (the acks already sent stay sent).

        Done before draining NATS: a drain waits for a pull subscription that last saw a
        fetch time out until the drain timeout, so it is unsubscribed first.
        """
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except nats.errors.Error as exc:
                log.warning("audit_unsubscribe_failed", error=str(exc) or type(exc).__name__)

    async def run(self) -> None:
        if self._sub is None:
            raise RuntimeError("subscribe() before run()")
        sub = self._sub
        while not self._stopping.is_set():
            try:
                msgs = await sub.fetch(self._batch_size, timeout=FETCH_TIMEOUT)
            except TimeoutError:
                await self._refresh_lag(sub)
                continue
            except nats.errors.Error as exc:
                if self._stopping.is_set():
                    break
                log.warning("audit_fetch_failed", error=str(exc) or type(exc).__name__)
                await self._pause(FETCH_TIMEOUT)
                continue
            await self.handle(msgs)
            self._metrics.consumer_lag.set(msgs[-1].metadata.num_pending)

    async def handle(self, msgs: list[Msg]) -> None:
        """Store one fetched batch, then acknowledge all of it."""
        events: list[Incoming] = []
        dead: list[DeadLetter] = []
        for msg in msgs:
            meta = msg.metadata
            origin = Origin(
                stream=meta.stream,
                stream_seq=meta.sequence.stream,
                subject=msg.subject,
                published=meta.timestamp,
            )
            decoded = decode(msg.data, origin)
            if isinstance(decoded, DeadLetter):
                log.warning(
                    "audit_dead_letter",
                    reason=decoded.reason.value,
                    detail=decoded.detail,
                    stream_seq=origin.stream_seq,
                    subject=origin.subject,
                )
                dead.append(decoded)
            else:
                events.append(decoded)
        result = await self._write(msgs, events, dead)
        if result is None:
            return  # stopping with the store down: left unacknowledged for redelivery
        for msg in msgs:
            try:
                await msg.ack()
            except nats.errors.Error as exc:  # redelivered later; the store skips it then
                log.warning("audit_ack_failed", error=str(exc) or type(exc).__name__)
        self.tally.add(result)
        for outcome, n in result.stored.items():
            self._metrics.events.labels(outcome=outcome).inc(n)
        for reason, n in result.dead_letters.items():
            self._metrics.dead_letters.labels(reason=reason).inc(n)
        if result.duplicates:
            self._metrics.duplicates.inc(result.duplicates)

    async def _write(
        self, msgs: list[Msg], events: list[Incoming], dead: list[DeadLetter]
    ) -> WriteResult | None:
        """Commit the batch, retrying while the store is unavailable."""
        backoff = 0.1
        last_progress = time.monotonic()
        while True:
            started = time.perf_counter()
            try:
                result = await self._store.write(events, dead)
            except StoreError as exc:
                self.tally.store_errors += 1
                log.warning("audit_store_write_failed", error=str(exc), retry_in=backoff)
                if self._stopping.is_set():
                    log.warning("audit_batch_left_for_redelivery", messages=len(msgs))
                    return None
                if time.monotonic() - last_progress > self._ack_wait / 2:
                    # Still ours: keep JetStream from handing the batch to another replica.
                    for msg in msgs:
                        await msg.in_progress()
                    last_progress = time.monotonic()
                await self._pause(backoff)
                backoff = min(backoff * 2, RETRY_BACKOFF_MAX)
                continue
            self._metrics.store_latency.labels(store=self._store.kind).observe(
                time.perf_counter() - started
            )
            return result

    async def _pause(self, seconds: float) -> None:
        """Sleep, but wake at once when asked to stop."""
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except TimeoutError:
            return

    async def _refresh_lag(self, sub: JetStreamContext.PullSubscription) -> None:
        now = time.monotonic()
        if now - self._lag_checked < LAG_REFRESH:
            return
        self._lag_checked = now
        try:
            info = await asyncio.wait_for(sub.consumer_info(), API_TIMEOUT)
        except (TimeoutError, nats.errors.Error) as exc:
            log.warning("audit_consumer_info_failed", error=str(exc) or type(exc).__name__)
            return
        self._metrics.consumer_lag.set(info.num_pending or 0)
