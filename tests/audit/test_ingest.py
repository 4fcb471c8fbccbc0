"""Exactly-once ingest with the real service: a backlog, a SIGKILL mid-burst, republished
events and malformed messages, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import httpx
import orjson
import psycopg
from nats.aio.client import Client as NatsClient

from hotseat_audit.decoding import DeadLetterReason
from hotseat_audit.store import parse_dsn
from hotseat_common.audit_stream import AuditStreamSpec, ensure_audit_stream
from hotseat_common.messages.audit import RequestOutcome
from hotseat_common.subjects import AUDIT_DURABLE, Subjects
from tests.audit.conftest import AuditFactory, stream_name
from tests.audit.support import (
    T0,
    counts,
    publish_events,
    publish_raw,
    raw_rows,
    request_events,
    stored_ids,
    wait_until,
)
from tests.support.audit_trail import wait_consumed


async def _make_stream(nc: NatsClient, prefix: str, **limits: float) -> Subjects:
    subjects = Subjects(prefix)
    spec = AuditStreamSpec(name=stream_name(prefix), subjects=subjects, **limits)
    await ensure_audit_stream(nc.jetstream(), spec)
    return subjects


async def test_backlog_published_while_stopped_is_stored_exactly_once(
    nc: NatsClient, prefix: str, store_dsn: str, start_audit: AuditFactory
) -> None:
    """10,000 events published while the service is down are all there after it starts,
    each exactly once."""
    js = nc.jetstream()
    subjects = await _make_stream(nc, prefix)
    events = request_events(10_000)
    acks = await publish_events(js, subjects, events)
    assert acks[-1].seq == 10_000

    start_audit(store_dsn)
    await wait_consumed(js, stream_name(prefix), AUDIT_DURABLE, 10_000)

    assert await counts(store_dsn) == (10_000, 10_000)
    assert await stored_ids(store_dsn) == {e.id for e in events}


async def test_sigkill_mid_burst_loses_and_duplicates_nothing(
    nc: NatsClient, prefix: str, store_dsn: str, start_audit: AuditFactory
) -> None:
    """Killed with SIGKILL while ingesting a burst and restarted, the service ends with
    every event stored once: count and distinct ids both exact."""
    js = nc.jetstream()
    subjects = await _make_stream(nc, prefix)
    burst = request_events(10_000)
    await publish_events(js, subjects, burst)
    # Small batches make ingest take long enough to be interrupted half-way; a short
    # ack wait makes JetStream redeliver the dead process's unacknowledged batch quickly.
    service = start_audit(store_dsn, "--batch-size", "20", "--ack-wait", "1")

    async def some_stored() -> bool:
        return (await counts(store_dsn))[0] >= 500

    await wait_until(some_stored, timeout=30, what="the first rows")
    service.kill()
    at_kill, _ = await counts(store_dsn)
    assert 0 < at_kill < len(burst), f"kill did not land mid-burst ({at_kill} rows)"

    more = request_events(2_000, start=T0 + timedelta(days=1))
    acks = await publish_events(js, subjects, more)
    start_audit(store_dsn, "--ack-wait", "1")
    await wait_consumed(js, stream_name(prefix), AUDIT_DURABLE, acks[-1].seq)

    expected = {e.id for e in [*burst, *more]}
    assert await counts(store_dsn) == (len(expected), len(expected))
    assert await stored_ids(store_dsn) == expected


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


async def test_republished_event_is_stored_once(
    nc: NatsClient, prefix: str, store_dsn: str, start_audit: AuditFactory
) -> None:
    """The same event published twice, within the stream's de-dup window and again after
    it has passed (so JetStream keeps both copies), makes one row."""
    js = nc.jetstream()
    # A window long enough that the second publish, sent right after the first, is inside
    # it on any machine; the loop below then waits for it to pass.
    service = start_audit(store_dsn, "--duplicate-window", "3s")
    subjects = Subjects(prefix)
    event = request_events(1)[0]
    first = (await publish_events(js, subjects, [event]))[0]
    again = (await publish_events(js, subjects, [event]))[0]
    assert again.duplicate, "inside the window JetStream itself drops the copy"

    async def window_passed() -> bool:
        nonlocal again
        again = (await publish_events(js, subjects, [event]))[0]
        return not again.duplicate

    await wait_until(window_passed, timeout=30, what="the de-dup window to pass", interval=0.1)
    assert again.seq > first.seq, "the stream now holds a second copy of the event"
    await wait_consumed(js, stream_name(prefix), AUDIT_DURABLE, again.seq)

    assert await counts(store_dsn) == (1, 1)
    async with httpx.AsyncClient(base_url=service.url, timeout=5) as client:
        metrics = (await client.get("/metrics")).text
    assert _metric(metrics, "hotseat_audit_duplicates_total") == 1
    assert _metric(metrics, 'hotseat_audit_events_total{outcome="served"}') == 1


async def test_malformed_events_are_dead_lettered_without_blocking(
    nc: NatsClient, prefix: str, store_dsn: str, start_audit: AuditFactory
) -> None:
    """Malformed JSON, non-objects, unknown versions and invalid events (one holding NUL,
    which PostgreSQL cannot store) land in the dead-letter store with their reason and raw
    payload; valid events around them are stored."""
    js = nc.jetstream()
    service = start_audit(store_dsn, "--batch-size", "3")
    subjects = Subjects(prefix)
    good = request_events(4)
    subject = subjects.audit("request", RequestOutcome.SERVED)
    unknown_version = orjson.dumps({**good[0].model_dump(mode="json"), "id": "v2", "v": 2})
    # Valid JSON, a valid event, but a NUL in a text field: PostgreSQL would refuse its
    # whole batch again and again, and nothing after it would ever be stored.
    nul = good[0].model_copy(update={"id": "nul", "request_id": "a\x00b"}).to_bytes()
    bad = {
        nul: DeadLetterReason.INVALID_EVENT,
        b"{not json": DeadLetterReason.MALFORMED_JSON,
        b"[1, 2, 3]": DeadLetterReason.NOT_AN_OBJECT,
        unknown_version: DeadLetterReason.UNKNOWN_VERSION,
        b'{"v": 1, "id": "x", "kind": "request", "outcome": "swap_started"}': (
            DeadLetterReason.INVALID_EVENT
        ),
        b'{"v": 1, "id": "y", "outcome": "served"}': DeadLetterReason.INVALID_EVENT,
    }
    await publish_events(js, subjects, good[:1])
    raw = list(bad)
    await publish_raw(js, subject, raw[:2])
    await publish_events(js, subjects, good[1:2])
    await publish_raw(js, subject, raw[2:])
    acks = await publish_events(js, subjects, good[2:])
    await wait_consumed(js, stream_name(prefix), AUDIT_DURABLE, acks[-1].seq)

    assert await stored_ids(store_dsn) == {e.id for e in good}
    rows = await raw_rows(store_dsn, "SELECT payload, reason, detail FROM audit_dead_letters")
    assert {bytes(r[0]): r[1] for r in rows} == {p: r.value for p, r in bad.items()}  # type: ignore[arg-type]
    assert all(r[2] for r in rows), "every dead letter says why"

    async with httpx.AsyncClient(base_url=service.url, timeout=5) as client:
        listed = (await client.get("/v1/dead-letters")).json()
        metrics = (await client.get("/metrics")).text
    assert {d["payload_text"] for d in listed["dead_letters"]} == {p.decode() for p in bad}
    assert _metric(metrics, 'hotseat_audit_dead_letters_total{reason="invalid_event"}') == 3
    assert _metric(metrics, 'hotseat_audit_dead_letters_total{reason="malformed_json"}') == 1


@contextmanager
def _writes_blocked(dsn: str) -> Iterator[None]:
    """Hold the store's write lock from outside, as a slow or stuck database would."""
    target = parse_dsn(dsn)
    if target.kind == "sqlite":
        conn = sqlite3.connect(target.location, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()
        return
    with psycopg.connect(target.location) as pg:
        pg.execute("LOCK TABLE audit_events IN SHARE MODE")
        try:
            yield
        finally:
            pg.rollback()


async def test_messages_are_acked_only_after_their_rows_commit(
    nc: NatsClient, prefix: str, store_dsn: str, start_audit: AuditFactory
) -> None:
    """While the store cannot commit, delivered messages stay unacknowledged; once it
    can, every row lands and only then is every message acknowledged."""
    js = nc.jetstream()
    start_audit(store_dsn)
    events = request_events(100)
    with _writes_blocked(store_dsn):
        acks = await publish_events(js, Subjects(prefix), events)

        async def delivered() -> bool:
            info = await js.consumer_info(stream_name(prefix), AUDIT_DURABLE)
            return (info.delivered.stream_seq or 0) >= acks[-1].seq

        await wait_until(delivered, timeout=15, what="delivery to the audit consumer")
        for _ in range(10):  # an observation window: nothing may be acknowledged in it
            info = await js.consumer_info(stream_name(prefix), AUDIT_DURABLE)
            assert info.ack_floor is None or not info.ack_floor.stream_seq
            assert info.num_ack_pending == len(events)
            await asyncio.sleep(0.1)  # spreads the window's ten looks over a second
    await wait_consumed(js, stream_name(prefix), AUDIT_DURABLE, acks[-1].seq)
    assert await counts(store_dsn) == (100, 100)
