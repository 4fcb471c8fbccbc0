"""Fault tests of the audit trail: a lost publish ack, consumers killed around their
commit, the database down (guarantees 10, 11 and 12 of docs/reliability.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient
from prometheus_client import CollectorRegistry

from hotseat.launcher import Managed, free_port, start_service
from hotseat_common.audit_stream import AuditPublisher, AuditStreamSpec, ensure_audit_stream
from hotseat_common.connections import open_nats
from hotseat_common.metrics import AuditPublishMetrics
from hotseat_common.subjects import AUDIT_DURABLE, Subjects
from tests.audit.support import (
    counts,
    drop_schema,
    fill_history,
    postgres_schema_dsn,
    publish_events,
    publish_raw,
    raw_rows,
    request_events,
    stored_ids,
    wait_until,
)
from tests.fault.conftest import StartProxy
from tests.support.audit_trail import store_caught_up, wait_consumed
from tests.support.faultproxy import DOWN, UP, seen
from tests.support.procs import freeze, kill

pytestmark = pytest.mark.fault

DB_OUTAGE_S = 8.0
"""How long the database stays down in the outage test. The product's promise is about
any outage (JetStream keeps the backlog for the stream's max age, 30 days by default), and
nothing in the consumer depends on the length once it is several times the ack wait (2 s
here): every second of it the batch in hand is kept alive with in-progress acks and the
rest waits in the stream. 8 s covers four ack waits and keeps the suite fast; 30 s gives
the same result."""


def stream_name(prefix: str) -> str:
    return f"AUDIT_{prefix}"


async def make_stream(nc: NatsClient, prefix: str) -> Subjects:
    subjects = Subjects(prefix)
    spec = AuditStreamSpec(name=stream_name(prefix), subjects=subjects)
    await ensure_audit_stream(nc.jetstream(), spec)
    return subjects


@dataclass(frozen=True)
class AuditDb:
    dsn: str
    history: int
    """Rows that were in the store before the test (a store in service holds data)."""

    async def counts(self) -> tuple[int, int]:
        """(rows, distinct ids) the test added."""
        rows, distinct = await counts(self.dsn)
        return rows - self.history, distinct - self.history


@pytest.fixture(params=["sqlite", "postgres-with-history"])
async def audit_db(
    request: pytest.FixtureRequest, tmp_path: Path, prefix: str
) -> AsyncIterator[AuditDb]:
    """An empty SQLite file, or a PostgreSQL schema already holding a week of events."""
    if request.param == "sqlite":
        yield AuditDb(f"sqlite:///{tmp_path / 'audit.db'}", 0)
        return
    base: str = request.getfixturevalue("postgres_dsn")
    dsn = postgres_schema_dsn(base, prefix)
    try:
        yield AuditDb(dsn, await fill_history(dsn))
    finally:
        drop_schema(base, prefix)


_STARTED: list[Managed] = []


@pytest.fixture(autouse=True)
def _stop_audit_services() -> Iterator[None]:
    """Every audit process a test started is stopped with it (none outlives its test)."""
    yield
    while _STARTED:
        _STARTED.pop().stop(5)


def start_audit(
    tmp_path: Path, prefix: str, nats_url: str, dsn: str, *extra: str, name: str = "audit"
) -> Managed:
    args = [
        "--nats-url", nats_url,
        "--subject-prefix", prefix,
        "--audit-stream", stream_name(prefix),
        "--dsn", dsn,
        *extra,
    ]  # fmt: skip
    proc = start_service(name, "hotseat-audit", args, port=free_port(), log_dir=tmp_path / "logs")
    _STARTED.append(proc)
    return proc


async def dead_letters(dsn: str) -> int:
    rows = await raw_rows(dsn, "SELECT count(*) FROM audit_dead_letters")
    return int(rows[0][0])  # type: ignore[call-overload]


async def test_a_lost_publish_ack_stores_the_retried_event_once(  # noqa: PLR0917 - fixtures
    nc: NatsClient,
    prefix: str,
    tmp_path: Path,
    nats_server: Managed,
    proxies: StartProxy,
    audit_db: AuditDb,
) -> None:
    """A publisher's event reaches JetStream but the ack never comes back (the connection
    dies with it): the publisher retries the same event id, JetStream de-duplicates it,
    and the audit store holds it once."""
    subjects = await make_stream(nc, prefix)
    start_audit(tmp_path, prefix, nats_server.url, audit_db.dsn)
    proxy = proxies(int(nats_server.url.rsplit(":", 1)[1]))
    publisher_nc = await open_nats(proxy.url("nats"), reconnect_time_wait=0.2)
    registry = CollectorRegistry()
    metrics = AuditPublishMetrics(registry)
    publisher = AuditPublisher(publisher_nc, subjects, metrics)
    publisher.start()
    try:
        proxy.blackhole(DOWN)  # nothing comes back from the server from now on
        first = proxy.when_seen(b"HPUB", UP, hold=False)
        (event,) = request_events(1)
        publisher.emit(event)
        await seen(first, 10)
        retried = proxy.when_seen(b"HPUB", UP, hold=False)
        await seen(retried, 10)  # the ack did not come: the same event is sent again
        proxy.reset()  # the connection dies, and the held acks with it
        proxy.pass_()
        assert await publisher.flush(30), "the publisher never got an ack"
    finally:
        await publisher.close(5)
        await publisher_nc.close()
    info = await nc.jetstream().stream_info(stream_name(prefix))
    assert info.state.messages == 1
    assert metrics.published._value.get() == 1

    await store_caught_up(nc.jetstream(), stream_name(prefix), AUDIT_DURABLE)
    assert await audit_db.counts() == (1, 1)
    assert await stored_ids(audit_db.dsn) >= {event.id}


@pytest.mark.parametrize("moment", ["after_commit", "before_commit"])
async def test_consumer_killed_around_its_commit_stores_every_event_once(  # noqa: PLR0917 - fixtures
    nc: NatsClient,
    prefix: str,
    tmp_path: Path,
    nats_server: Managed,
    proxies: StartProxy,
    audit_db: AuditDb,
    moment: str,
) -> None:
    """The audit consumer is SIGKILLed right after committing a batch but before any ack
    reached JetStream, or after receiving it but before committing: a new consumer gets
    the batch again and every event ends up stored exactly once, with the poison message
    of the batch in the dead-letter store once."""
    js = nc.jetstream()
    subjects = await make_stream(nc, prefix)
    proxy = proxies(int(nats_server.url.rsplit(":", 1)[1]))
    events = request_events(50)

    async def publish() -> int:
        await publish_events(js, subjects, events[:25])
        await publish_raw(js, subjects.audit("request", "served"), [b"{not json"])
        return (await publish_events(js, subjects, events[25:]))[-1].seq

    def audit_via_proxy() -> Managed:
        return start_audit(
            tmp_path, prefix, proxy.url("nats"), audit_db.dsn, "--batch-size", "100",
            "--ack-wait", "2",
        )  # fmt: skip

    if moment == "after_commit":
        # The whole backlog is one batch. Acks (publishes to each message's $JS.ACK reply
        # subject) go out only after its transaction committed: hold the first and the rest.
        last = await publish()
        tripped = proxy.when_seen(b"PUB $JS.ACK.", UP)
        audit = audit_via_proxy()
    else:
        # The consumer is idle when the batch arrives; it is frozen before it can read it.
        audit = audit_via_proxy()
        tripped = proxy.when_seen(b"$JS.ACK.", DOWN, lambda: freeze(audit), hold=False)
        last = await publish()
    await seen(tripped, 20)
    if moment == "after_commit":

        async def committed() -> bool:
            return (await audit_db.counts())[0] == 50 and await dead_letters(audit_db.dsn) == 1

        await wait_until(committed, timeout=20, what="the batch committed")
    kill(audit)
    if moment == "before_commit":
        assert await audit_db.counts() == (0, 0)
    start_audit(
        tmp_path, prefix, nats_server.url, audit_db.dsn, "--ack-wait", "2", name="audit-again"
    )
    await wait_consumed(js, stream_name(prefix), AUDIT_DURABLE, last, timeout=60)
    assert await audit_db.counts() == (50, 50)
    assert await dead_letters(audit_db.dsn) == 1


async def test_database_down_backlog_waits_and_drains(  # noqa: PLR0917 - fixtures
    nc: NatsClient,
    prefix: str,
    tmp_path: Path,
    nats_server: Managed,
    proxies: StartProxy,
    postgres_dsn: str,
) -> None:
    """PostgreSQL (holding a week of events already) unreachable for DB_OUTAGE_S while
    events keep coming: nothing is lost (the backlog waits in JetStream), nothing is stored
    twice, and the backlog drains once the database is back."""
    js = nc.jetstream()
    subjects = await make_stream(nc, prefix)
    port = int(postgres_dsn.rsplit(":", 1)[1].split("/", maxsplit=1)[0])
    proxy = proxies(port)
    direct = postgres_schema_dsn(postgres_dsn, prefix)
    try:
        db = AuditDb(direct, await fill_history(direct))
        via_proxy = direct.replace(f":{port}/", f":{proxy.port}/", 1)
        start_audit(tmp_path, prefix, nats_server.url, via_proxy, "--ack-wait", "2")
        events = request_events(600)
        await publish_events(js, subjects, events[:100])
        await wait_consumed(js, stream_name(prefix), AUDIT_DURABLE, 100)
        proxy.reset()  # the database is gone: connections die, new ones are refused
        down_at = time.monotonic()
        acks = await publish_events(js, subjects, events[100:])
        # The outage itself: the database stays unreachable this long (see DB_OUTAGE_S).
        await asyncio.sleep(max(0.0, DB_OUTAGE_S - (time.monotonic() - down_at)))  # outage
        assert await db.counts() == (100, 100)
        info = await js.consumer_info(stream_name(prefix), AUDIT_DURABLE)
        assert (info.ack_floor.stream_seq or 0) < acks[-1].seq
        proxy.pass_()
        await wait_consumed(js, stream_name(prefix), AUDIT_DURABLE, acks[-1].seq, timeout=60)
        assert await db.counts() == (600, 600)
    finally:
        drop_schema(postgres_dsn, prefix)
