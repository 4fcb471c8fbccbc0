"""The hotseat-audit process: settings, graceful SIGTERM, retention, bad start-up input."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from nats.aio.client import Client as NatsClient
from prometheus_client import CollectorRegistry

from hotseat.launcher import Managed, find_binary, free_port, start_service
from hotseat_audit.decoding import Incoming
from hotseat_audit.query import EventFilter
from hotseat_audit.retention import RetentionJob
from hotseat_audit.settings import DEFAULT_DSN, AuditSettings
from hotseat_audit.store import AuditStore
from hotseat_audit.store.migrations import LATEST
from hotseat_common.metrics import AuditMetrics
from hotseat_common.settings import load_settings
from hotseat_common.subjects import AUDIT_DURABLE, Subjects
from tests.audit.conftest import AuditFactory, stream_name
from tests.audit.support import (
    T0,
    counts,
    publish_events,
    raw_rows,
    request_events,
    stored_ids,
    wait_until,
)
from tests.support.audit_trail import wait_consumed


def test_dsn_comes_from_hotseat_audit_dsn_and_the_dsn_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HOTSEAT_AUDIT_DSN sets the store, --dsn overrides it, HOTSEAT_DSN is not read."""
    monkeypatch.setenv("HOTSEAT_DSN", "sqlite:///wrong.db")
    assert load_settings(AuditSettings, [], prog="t", description="").dsn == DEFAULT_DSN
    monkeypatch.setenv("HOTSEAT_AUDIT_DSN", "postgresql://db/audit")
    assert load_settings(AuditSettings, [], prog="t", description="").dsn == "postgresql://db/audit"
    flagged = load_settings(AuditSettings, ["--dsn", "sqlite:///x.db"], prog="t", description="")
    assert flagged.dsn == "sqlite:///x.db"


def test_durations_accept_seconds_or_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention and stream limits read plain seconds or durations, from env or flags."""
    monkeypatch.setenv("HOTSEAT_AUDIT_RETENTION", "720h")
    settings = load_settings(
        AuditSettings, ["--duplicate-window", "2m", "--ack-wait", "1.5"], prog="t", description=""
    )
    assert settings.retention == 720 * 3600
    assert settings.duplicate_window == 120
    assert settings.ack_wait == 1.5
    assert settings.consumer == AUDIT_DURABLE


def test_bad_dsn_exits_2_with_the_reason() -> None:
    """An unusable DSN stops the service at once with exit code 2 and says why."""
    result = subprocess.run(
        [find_binary("hotseat-audit"), "--dsn", "mysql://db/audit"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "unsupported scheme 'mysql'" in result.stderr


async def test_sigterm_finishes_work_and_logs_a_tally(
    nc: NatsClient, prefix: str, tmp_path: Path, start_audit: AuditFactory
) -> None:
    """On SIGTERM the service acknowledges what it stored, exits 0 and logs one tally line;
    its metrics count the stored events and show no lag."""
    dsn = f"sqlite:///{tmp_path / 'audit.db'}"
    service = start_audit(dsn)
    js = nc.jetstream()
    acks = await publish_events(js, Subjects(prefix), request_events(300))
    await wait_consumed(js, stream_name(prefix), AUDIT_DURABLE, acks[-1].seq)
    async with httpx.AsyncClient(base_url=service.url, timeout=5) as client:
        ready = (await client.get("/readyz")).json()
        metrics = (await client.get("/metrics")).text
    assert ready["status"] == "ready"
    assert set(ready["checks"]) >= {"store_migrated", "consumer", "nats", "accepting"}
    assert 'hotseat_audit_events_total{outcome="served"} 300.0' in metrics
    assert "hotseat_audit_consumer_lag 0.0" in metrics

    assert service.stop() == 0
    tally = [line for line in service.log_text().splitlines() if "audit_stopped" in line]
    assert len(tally) == 1
    assert '"stored": 300' in tally[0]
    assert '"clean": true' in tally[0]
    info = await js.consumer_info(stream_name(prefix), AUDIT_DURABLE)
    assert info.num_ack_pending == 0


async def test_environment_dsn_is_used_by_the_process(
    nats_server: Managed, prefix: str, tmp_path: Path
) -> None:
    """Started with only HOTSEAT_AUDIT_DSN, the service creates and migrates that file."""
    db = tmp_path / "from-env" / "audit.db"
    service = start_service(
        "audit",
        "hotseat-audit",
        ["--nats-url", nats_server.url, "--subject-prefix", prefix,
         "--audit-stream", stream_name(prefix)],
        port=free_port(),
        log_dir=tmp_path,
        env={"HOTSEAT_AUDIT_DSN": f"sqlite:///{db}"},
    )  # fmt: skip
    try:
        assert db.exists()
        versions = await raw_rows(f"sqlite:///{db}", "SELECT version FROM schema_version")
        assert versions == [(v,) for v in range(1, LATEST + 1)]
    finally:
        service.stop()


async def test_service_retention_deletes_old_events(
    nc: NatsClient, prefix: str, store_dsn: str, start_audit: AuditFactory
) -> None:
    """With a one-hour retention, events older than an hour disappear, newer ones stay."""
    now = datetime.now(UTC)
    old = request_events(20, start=now - timedelta(hours=3))
    new = request_events(5, start=now - timedelta(minutes=5))
    start_audit(store_dsn, "--retention", "1h", "--retention-interval", "0.2")
    acks = await publish_events(nc.jetstream(), Subjects(prefix), [*old, *new])
    await wait_consumed(nc.jetstream(), stream_name(prefix), AUDIT_DURABLE, acks[-1].seq)

    async def only_new_left() -> bool:
        return await stored_ids(store_dsn) == {e.id for e in new}

    await wait_until(only_new_left, timeout=15, what="old events to be deleted")
    assert await counts(store_dsn) == (5, 5)


async def test_retention_job_deletes_in_batches_until_done(store: AuditStore) -> None:
    """One retention run deletes every row past the cutoff, a batch at a time, and counts
    them in the metric."""
    events = request_events(10)
    await store.write([Incoming(e, i) for i, e in enumerate(events)], [])
    registry = CollectorRegistry()
    job = RetentionJob(
        store,
        AuditMetrics(registry),
        max_age=3600,
        interval=60,
        batch=3,
        clock=lambda: T0 + timedelta(hours=1, seconds=7),
    )
    assert await job.run_once() == 7
    assert await job.run_once() == 0
    assert registry.get_sample_value("hotseat_audit_retention_deleted_total") == 7
    left = await store.events(EventFilter(), limit=100)
    assert sorted(e.request_id or "" for e in left) == ["req-7", "req-8", "req-9"]


async def test_deleted_consumer_is_recreated_and_ingest_goes_on(
    nc: NatsClient, prefix: str, tmp_path: Path, start_audit: AuditFactory
) -> None:
    """If someone deletes the durable consumer, the service recreates it and keeps storing."""
    dsn = f"sqlite:///{tmp_path / 'audit.db'}"
    service = start_audit(dsn)
    js = nc.jetstream()
    await js.delete_consumer(stream_name(prefix), AUDIT_DURABLE)
    events = request_events(50)
    acks = await publish_events(js, Subjects(prefix), events)
    await wait_consumed(js, stream_name(prefix), AUDIT_DURABLE, acks[-1].seq)
    assert await stored_ids(dsn) == {e.id for e in events}
    assert "audit_consumer_recreated" in service.log_text()


async def test_deleted_stream_stops_the_service_loudly(
    nc: NatsClient, prefix: str, tmp_path: Path, start_audit: AuditFactory
) -> None:
    """With its stream gone, the service logs why and exits non-zero (a restart recreates
    the stream) instead of serving a store that no longer fills."""
    service = start_audit(f"sqlite:///{tmp_path / 'audit.db'}")
    await nc.jetstream().delete_stream(stream_name(prefix))

    async def exited() -> bool:
        return not service.alive()

    await wait_until(exited, timeout=30, what="the service to exit")
    assert service.popen.returncode == 1
    assert "audit_loop_died" in service.log_text()
