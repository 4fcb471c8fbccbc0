"""The durable pull consumer that moves audit events from JetStream into the store.

Batches flow through two stages so decoding the next batch overlaps committing this one:

    fetch + decode  ->  (one batch ahead)  ->  commit in one transaction, then ack each

A message is acknowledged only after the transaction holding its row has committed. A
crash anywhere before the acks leaves the messages unacknowledged, so JetStream
redelivers them after ``ack_wait``; the store skips ids it already holds, so a
redelivery never makes a second row. A message that is not a valid event is stored as a
dead letter with the reason and acknowledged like any other, so it never blocks the ones
behind it.

Several replicas may share the durable consumer: JetStream spreads batches over them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from hotseat_audit.decoding import DeadLetter, Incoming, Origin, decode
from hotseat_audit.fetcher import ConsumerGone, PullFetcher
from hotseat_audit.store import AuditStore, StoreError, WriteResult
from hotseat_common.logging import get_logger
from hotseat_common.metrics import AuditMetrics

log = get_logger(__name__)

FETCH_TIMEOUT = 1.0
"""How long one fetch waits when the stream has nothing new."""
MIN_EMPTY_FETCH = 0.1
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


@dataclass(slots=True)
class Batch:
    """Fetched messages and what they decoded to."""

    msgs: list[Msg]
    events: list[Incoming] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)


def decode_batch(msgs: list[Msg]) -> Batch:
    batch = Batch(msgs)
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
            batch.dead.append(decoded)
        else:
            batch.events.append(decoded)
    return batch


class AuditConsumer:
    """Fetches, stores and acknowledges audit events until stopped."""

    def __init__(
        self,
        nc: NatsClient,
        store: AuditStore,
        metrics: AuditMetrics,
        *,
        stream: str,
        consumer: str,
        filter_subject: str,
        batch_size: int,
        ack_wait: float,
    ) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self._store = store
        self._metrics = metrics
        self._stream = stream
        self._consumer = consumer
        self._filter = filter_subject
        self._batch_size = batch_size
        self._ack_wait = ack_wait
        self._fetcher: PullFetcher | None = None
        self._stopping = asyncio.Event()
        self._lag_checked = 0.0
        self.tally = Tally()

    @property
    def subscribed(self) -> bool:
        return self._fetcher is not None

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
        """Create the durable consumer, or update its settings, and start fetching from it."""
        await self._js.add_consumer(self._stream, self.consumer_config(), timeout=API_TIMEOUT)
        fetcher = PullFetcher(self._nc, self._stream, self._consumer)
        await fetcher.start()
        self._fetcher = fetcher
        log.info(
            "audit_consumer_bound",
            stream=self._stream,
            consumer=self._consumer,
            batch_size=self._batch_size,
            ack_wait=self._ack_wait,
        )

    def stop(self) -> None:
        """Stop fetching; batches already fetched are still committed and acknowledged."""
        self._stopping.set()
        if self._fetcher is not None:
            self._fetcher.interrupt()

    async def close(self) -> None:
        """Stop receiving; messages delivered but not yet handled go back to JetStream."""
        fetcher, self._fetcher = self._fetcher, None
        if fetcher is not None:
            await fetcher.close()

    async def run(self) -> None:
        """Fetch and store until :meth:`stop`; returns once the last batch is acknowledged."""
        if self._fetcher is None:
            raise RuntimeError("subscribe() before run()")
        ready: asyncio.Queue[Batch | None] = asyncio.Queue(maxsize=1)
        async with asyncio.TaskGroup() as group:
            group.create_task(self._read(self._fetcher, ready), name="audit-fetch")
            group.create_task(self._commit_all(ready), name="audit-commit")

    async def _read(self, fetcher: PullFetcher, ready: asyncio.Queue[Batch | None]) -> None:
        while not self._stopping.is_set():
            asked = time.monotonic()
            try:
                msgs = await fetcher.fetch(self._batch_size, timeout=FETCH_TIMEOUT)
            except ConsumerGone as exc:
                # Recreate it; if the stream itself is gone this raises and the service
                # stops (a restart recreates the stream).
                log.warning("audit_consumer_recreated", reason=str(exc))
                fetcher.reset()
                await self._js.add_consumer(
                    self._stream, self.consumer_config(), timeout=API_TIMEOUT
                )
                continue
            except nats.errors.Error as exc:
                log.warning("audit_fetch_failed", error=str(exc) or type(exc).__name__)
                await self._pause(FETCH_TIMEOUT)
                continue
            if not msgs:
                await self._refresh_lag()
                if time.monotonic() - asked < MIN_EMPTY_FETCH:
                    await self._pause(MIN_EMPTY_FETCH)  # never spin on instant empty replies
                continue
            await ready.put(decode_batch(msgs))
            self._metrics.consumer_lag.set(msgs[-1].metadata.num_pending)
        await ready.put(None)  # the committer finishes what is queued, then returns

    async def _commit_all(self, ready: asyncio.Queue[Batch | None]) -> None:
        while (batch := await ready.get()) is not None:
            await self.commit(batch)

    async def commit(self, batch: Batch) -> None:
        """Store one batch in one transaction, then acknowledge all of its messages."""
        result = await self._write(batch)
        if result is None:
            # Stopping while the store is down: hand the batch straight back.
            for msg in batch.msgs:
                with contextlib.suppress(nats.errors.Error):
                    await msg.nak()
            return
        for msg in batch.msgs:
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

    async def _write(self, batch: Batch) -> WriteResult | None:
        """Commit the batch, retrying while the store is unavailable."""
        backoff = 0.1
        last_progress = time.monotonic()
        while True:
            started = time.perf_counter()
            try:
                result = await self._store.write(batch.events, batch.dead)
            except StoreError as exc:
                self.tally.store_errors += 1
                log.warning("audit_store_write_failed", error=str(exc), retry_in=backoff)
                if self._stopping.is_set():
                    log.warning("audit_batch_handed_back", messages=len(batch.msgs))
                    return None
                if time.monotonic() - last_progress > self._ack_wait / 2:
                    # Still ours: keep JetStream from handing the batch to another replica.
                    for msg in batch.msgs:
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
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _refresh_lag(self) -> None:
        now = time.monotonic()
        if now - self._lag_checked < LAG_REFRESH:
            return
        self._lag_checked = now
        try:
            info = await self._js.consumer_info(self._stream, self._consumer, timeout=API_TIMEOUT)
        except (TimeoutError, nats.errors.Error) as exc:
            log.warning("audit_consumer_info_failed", error=str(exc) or type(exc).__name__)
            return
        self._metrics.consumer_lag.set(info.num_pending or 0)
