"""The audit publisher against a real JetStream: events published in batches are each
stored once, a full buffer drops (and counts) what does not fit, closing publishes
everything queued before it returns (the router's SIGTERM drain), and an event the
stream did not take (no stream, or an error for an answer) stays until it is taken."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.js.api import DiscardPolicy
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
from tests.support.waiting import eventually


async def _setup(
    nc: NatsClient, prefix: str, **kwargs: Any
) -> tuple[AuditPublisher, AuditPublishMetrics, str]:
    subjects = Subjects(prefix)
    stream = f"AUDIT_{prefix}"
    await ensure_audit_stream(nc.jetstream(), AuditStreamSpec(name=stream, subjects=subjects))
    metrics = AuditPublishMetrics(CollectorRegistry())
    return AuditPublisher(nc, subjects, metrics, **kwargs), metrics, stream


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


async def test_events_with_no_stream_to_take_them_wait_for_one(nc: NatsClient, prefix: str) -> None:
    """No stream holds the audit subjects yet: the server answers each publish with "no
    responders", which is no ack. Nothing counts as published and the events stay; once
    the stream exists they are stored, each once."""
    subjects = Subjects(prefix)
    metrics = AuditPublishMetrics(CollectorRegistry())
    publisher = AuditPublisher(nc, subjects, metrics)
    publisher.start()
    try:
        ids = _emit(publisher, 20)
        await eventually(_value_of(metrics.batches, at_least=2))  # tried, and tried again
        assert metrics.published._value.get() == 0
        assert not await publisher.flush(0.01), "events no stream took count as published"
        stream = f"AUDIT_{prefix}"
        await ensure_audit_stream(nc.jetstream(), AuditStreamSpec(name=stream, subjects=subjects))
        assert await publisher.flush(60), "the events were never acknowledged"
    finally:
        await publisher.close(5)
    assert sorted(await _stored_ids(nc, stream, prefix)) == sorted(ids)
    assert metrics.published._value.get() == 20


async def test_events_the_stream_refuses_are_published_again(nc: NatsClient, prefix: str) -> None:
    """The stream is full and refuses new messages (``discard: new``): JetStream answers
    those publishes with an error, which is no ack. The refused events stay and are
    published again; once the stream has room, every event is stored once."""
    subjects = Subjects(prefix)
    stream = f"AUDIT_{prefix}"
    spec = AuditStreamSpec(name=stream, subjects=subjects)
    full = spec.config()
    full.discard, full.max_msgs = DiscardPolicy.NEW, 3
    await nc.jetstream().add_stream(full)
    metrics = AuditPublishMetrics(CollectorRegistry())
    publisher = AuditPublisher(nc, subjects, metrics)
    publisher.start()
    try:
        ids = _emit(publisher, 8)
        await eventually(_value_of(metrics.published, at_least=3))
        await eventually(_value_of(metrics.batches, at_least=2))  # the rest, tried again
        assert metrics.published._value.get() == 3
        assert not await publisher.flush(0.01), "events the stream refused count as published"
        await nc.jetstream().update_stream(spec.config())
        assert await publisher.flush(60), "the events were never acknowledged"
    finally:
        await publisher.close(5)
    assert sorted(await _stored_ids(nc, stream, prefix)) == sorted(ids)
    assert metrics.published._value.get() == 8


def _value_of(counter: Any, *, at_least: float) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return bool(counter._value.get() >= at_least)

    return check
