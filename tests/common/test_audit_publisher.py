"""The audit publisher against a real JetStream: events published in batches are each
stored once, a full buffer drops (and counts) what does not fit, and closing publishes
everything queued before it returns (the router's SIGTERM drain)."""

from __future__ import annotations

import asyncio
from typing import Any

from nats.aio.client import Client as NatsClient
from prometheus_client import CollectorRegistry

from hotseat_common.audit_stream import (
    MAX_BATCH,
    AuditPublisher,
    AuditStreamSpec,
    ensure_audit_stream,
)
from hotseat_common.messages.audit import encode_event
from hotseat_common.metrics import AuditPublishMetrics
from hotseat_common.subjects import Subjects


async def _setup(
    nc: NatsClient, prefix: str, **kwargs: Any
) -> tuple[AuditPublisher, AuditPublishMetrics, str]:
    subjects = Subjects(prefix)
    stream = f"AUDIT_{prefix}"
    await ensure_audit_stream(nc.jetstream(), AuditStreamSpec(name=stream, subjects=subjects))
    metrics = AuditPublishMetrics(CollectorRegistry())
    return AuditPublisher(nc.jetstream(), subjects, metrics, **kwargs), metrics, stream


def _emit(publisher: AuditPublisher, count: int) -> set[str]:
    ids = set()
    for n in range(count):
        event_id, data = encode_event("request", "served", {"request_id": f"r{n}"})
        publisher.emit_encoded("request", "served", event_id, data)
        ids.add(event_id)
    return ids


async def _stored_ids(nc: NatsClient, stream: str, prefix: str) -> list[str]:
    sub = await nc.jetstream().subscribe(f"{prefix}.audit.>", stream=stream, ordered_consumer=True)
    ids = []
    info = await nc.jetstream().stream_info(stream)
    for _ in range(info.state.messages):
        msg = await sub.next_msg(timeout=10)
        assert msg.headers is not None
        ids.append(msg.headers["Nats-Msg-Id"])
    await sub.unsubscribe()
    return ids


async def test_a_burst_larger_than_a_batch_is_stored_once_each(nc: NatsClient, prefix: str) -> None:
    publisher, metrics, stream = await _setup(nc, prefix)
    publisher.start()
    try:
        ids = _emit(publisher, MAX_BATCH * 4 + 7)
        assert await publisher.flush(60), "the burst was never acknowledged"
    finally:
        await publisher.close(5)
    stored = await _stored_ids(nc, stream, prefix)
    assert sorted(stored) == sorted(ids)
    assert metrics.published._value.get() == len(ids)
    assert metrics.buffered._value.get() == 0


async def test_a_full_buffer_drops_and_counts_the_rest(nc: NatsClient, prefix: str) -> None:
    publisher, metrics, stream = await _setup(nc, prefix, max_buffer=10)
    kept = _emit(publisher, 10)  # not started yet: everything waits in the buffer
    _emit(publisher, 5)
    assert metrics.dropped._value.get() == 5
    publisher.start()
    await publisher.close(30)
    assert sorted(await _stored_ids(nc, stream, prefix)) == sorted(kept)


async def test_close_publishes_everything_queued_first(nc: NatsClient, prefix: str) -> None:
    publisher, metrics, stream = await _setup(nc, prefix)
    publisher.start()
    ids = _emit(publisher, 700)
    await publisher.close(30)
    assert metrics.dropped._value.get() == 0
    assert sorted(await _stored_ids(nc, stream, prefix)) == sorted(ids)


async def test_events_that_come_one_at_a_time_are_published_together(
    nc: NatsClient, prefix: str
) -> None:
    """Events emitted on separate event-loop turns within the linger (a router's requests
    ending one by one) go out in one batch: one socket write and one wait for their acks,
    not one per event."""
    publisher, metrics, stream = await _setup(nc, prefix, linger=2.0)
    publisher.start()
    try:
        ids: set[str] = set()
        for _ in range(50):
            ids |= _emit(publisher, 1)
            await asyncio.sleep(0)
        assert await publisher.flush(60), "the events were never acknowledged"
    finally:
        await publisher.close(5)
    assert sorted(await _stored_ids(nc, stream, prefix)) == sorted(ids)
    assert metrics.published._value.get() == 50
    assert metrics.batches._value.get() == 1
