"""The audit trail as a test reads it, complete: the stream read up to its last sequence
(never "a fetch timed out, so that was the end"), and settled: every publisher's buffer
empty and the store caught up. An absence check ("no ``lease_expired``") reads the
settled trail, so an event still waiting in a router's or a controller's buffer, or still
on its way into the audit store, cannot hide from it::

    await publishers_flushed(stack.publishers())       # every emitted event acknowledged
    events = await stream_events(nats_url, stream, f"{prefix}.audit.>")
    await store_caught_up(js, stream, AUDIT_DURABLE)   # and stored (rows before acks)
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import httpx
import orjson
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from hotseat.launcher import Managed
from hotseat_common.connections import open_nats
from tests.support.waiting import eventually

PUBLISHED = "hotseat_audit_events_published_total"
BUFFERED = "hotseat_audit_events_buffered"
DROPPED = "hotseat_audit_events_dropped_total"


def event_time(event: dict[str, Any]) -> float:
    """An audit event's ``time`` as Unix seconds."""
    return datetime.fromisoformat(event["time"]).timestamp()


async def metric_total(url: str, name: str) -> float:
    """The sum of every sample of ``name`` on ``url``/metrics (0 when absent)."""
    async with httpx.AsyncClient(timeout=5) as client:
        text = (await client.get(f"{url}/metrics")).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def _publishing(urls: Iterable[str]) -> dict[str, float]:
    """Audit events published (acknowledged by JetStream), still buffered and dropped,
    summed over the services at ``urls`` (routers and controllers)."""
    totals = {"published": 0.0, "buffered": 0.0, "dropped": 0.0}
    for url in urls:
        totals["published"] += await metric_total(url, PUBLISHED)
        totals["buffered"] += await metric_total(url, BUFFERED)
        totals["dropped"] += await metric_total(url, DROPPED)
    return totals


async def publishers_flushed(procs: Iterable[Managed], *, timeout: float = 30) -> dict[str, float]:
    """Wait until no live publisher holds an unacknowledged event (the buffered gauge is set
    after each acknowledgement, so 0 means every event emitted so far is in the stream; a
    dead one's buffer is gone); the publishing totals then."""
    return await urls_flushed([proc.url for proc in procs if proc.alive()], timeout=timeout)


async def urls_flushed(urls: Iterable[str], *, timeout: float = 30) -> dict[str, float]:
    """:func:`publishers_flushed` for services known by their URL."""
    urls = list(urls)

    async def flushed() -> dict[str, float] | None:
        totals = await _publishing(urls)
        return totals if totals["buffered"] == 0 else None

    result: dict[str, float] = await eventually(flushed, timeout=timeout, interval=0.05)
    return result


async def stream_events(nats_url: str, stream: str, subject: str) -> list[dict[str, Any]]:
    """Every event of ``stream`` on ``subject``, oldest first, read up to the stream's last
    sequence as it stood when the call began."""
    nc = await open_nats(nats_url, connect_timeout=2)
    try:
        js = nc.jetstream()
        try:
            state = (await js.stream_info(stream)).state
        except NotFoundError:
            return []  # nothing was ever published: the stream is created with the first
        if state.messages == 0:
            return []
        sub = await js.pull_subscribe(
            subject,
            stream=stream,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE),
        )
        events: list[dict[str, Any]] = []
        last_read = 0
        try:
            while last_read < state.last_seq:
                # A fetch that times out here raises: the stream holds fewer events than it
                # said it does, and that is a failure, not the end of the trail.
                for msg in await sub.fetch(256, timeout=10):
                    events.append(orjson.loads(msg.data))
                    last_read = msg.metadata.sequence.stream
        finally:
            await sub.unsubscribe()
        return events
    finally:
        await nc.close()


async def store_caught_up(
    js: JetStreamContext, stream: str, durable: str, *, timeout: float = 60
) -> int:
    """Wait until the audit consumer ``durable`` has acknowledged every message the stream
    holds now (rows are committed before their acks, so all of them are stored); the
    stream's last sequence."""
    last = (await js.stream_info(stream)).state.last_seq
    await wait_consumed(js, stream, durable, last, timeout=timeout)
    return last


async def wait_consumed(
    js: JetStreamContext, stream: str, consumer: str, last_seq: int, *, timeout: float = 60
) -> None:
    """Wait until the consumer's ack floor reaches ``last_seq``: rows are committed before
    acks, so every message up to it is in the store."""

    async def done() -> bool:
        try:
            info = await js.consumer_info(stream, consumer, timeout=2)
        except (NotFoundError, TimeoutError):  # not created yet, or a slow reply
            return False
        return info.ack_floor is not None and (info.ack_floor.stream_seq or 0) >= last_seq

    await eventually(done, timeout=timeout, interval=0.05)
