"""`hotseat audit query`, `summary` and `tail` against a real service and real NATS."""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient

from hotseat.audit_cli import _moment
from hotseat.cli import main
from hotseat.launcher import find_binary
from hotseat_common.audit_stream import AuditStreamSpec, ensure_audit_stream
from hotseat_common.messages.audit import PoolOutcome
from hotseat_common.subjects import AUDIT_DURABLE, Subjects
from tests.audit.conftest import AuditFactory, stream_name
from tests.audit.support import T0, pool_event, publish_events, request_events
from tests.support.audit_trail import wait_consumed


@pytest.fixture
async def service_url(
    nc: NatsClient, prefix: str, tmp_path: Path, start_audit: AuditFactory
) -> str:
    """A running audit service holding 5 served events on gpu0 and 2 swaps on gpu1."""
    service = start_audit(f"sqlite:///{tmp_path / 'audit.db'}")
    events = [
        *request_events(5),
        pool_event(PoolOutcome.SWAP_STARTED, T0, pool="gpu1", member="big", to_member="big"),
        pool_event(PoolOutcome.SWAP_COMPLETED, T0, pool="gpu1", member="big", to_member="big"),
    ]
    acks = await publish_events(nc.jetstream(), Subjects(prefix), events)
    await wait_consumed(nc.jetstream(), stream_name(prefix), AUDIT_DURABLE, acks[-1].seq)
    return service.url


def test_query_prints_a_table_following_every_page(
    service_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`query --all` follows the cursor and prints one row per event under a header."""
    code = main(["audit", "query", "--url", service_url, "--pool", "gpu0", "--limit", "2", "--all"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0].split()[:4] == ["TIME", "KIND", "OUTCOME", "POOL/MEMBER"]
    rows = out[1:-1]
    assert [r.split()[2:5] for r in rows] == [["request", "served", "gpu0/assistant"]] * 5
    assert [r.split()[-1] for r in rows] == [f"req-{i}" for i in (4, 3, 2, 1, 0)]
    assert out[-1] == "(5 events)"


def test_query_json_lines_and_filters(service_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`query --json` prints one event per line; repeated filters mean any of them."""
    args = ["audit", "query", "--url", service_url, "--json",
            "--outcome", "swap_started", "--outcome", "swap_completed"]  # fmt: skip
    assert main(args) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(e["outcome"] for e in events) == ["swap_completed", "swap_started"]


def test_query_reports_api_errors(service_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A rejected filter exits 1 with the service's message; an unreachable URL exits 1."""
    assert main(["audit", "query", "--url", service_url, "--outcome", "exploded"]) == 1
    assert "422 invalid_parameter: outcome: 'exploded' is not one of" in capsys.readouterr().err
    assert main(["audit", "query", "--url", "http://127.0.0.1:1"]) == 1
    assert "cannot reach" in capsys.readouterr().err


def test_summary_prints_counts(service_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`summary` prints the totals by outcome and by pool/member for the window."""
    since, until = (T0 - timedelta(days=1)).isoformat(), (T0 + timedelta(days=1)).isoformat()
    assert main(["audit", "summary", "--url", service_url, "--since", since, "--until", until]) == 0
    out = capsys.readouterr().out
    assert ": 7 events" in out
    assert any(line.split() == ["served", "5"] for line in out.splitlines())
    assert any(line.split()[:3] == ["gpu1", "big", "2"] for line in out.splitlines())


async def test_tail_follows_new_events(nc: NatsClient, prefix: str) -> None:
    """`tail --kind pool --count 2` prints a header once subscribed, then only new pool
    events, and exits after two."""
    subjects = Subjects(prefix)
    stream = stream_name(prefix)
    await ensure_audit_stream(nc.jetstream(), AuditStreamSpec(name=stream, subjects=subjects))
    await publish_events(nc.jetstream(), subjects, request_events(1))  # before: not shown
    proc = await asyncio.create_subprocess_exec(
        find_binary("hotseat"), "audit", "tail", "--nats-url", str(nc.connected_url.geturl()),
        "--subject-prefix", prefix, "--stream", stream, "--kind", "pool", "--count", "2",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        header = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert header.split()[:3] == [b"TIME", b"KIND", b"OUTCOME"]
        swaps = [
            pool_event(PoolOutcome.SWAP_STARTED, T0, pool="gpu0", from_member="a", to_member="b"),
            pool_event(PoolOutcome.SWAP_COMPLETED, T0, pool="gpu0", from_member="a", to_member="b"),
        ]
        await publish_events(nc.jetstream(), subjects, [*request_events(2), *swaps])
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0
    rows = out.decode().splitlines()
    assert [r.split()[2:4] for r in rows] == [["pool", "swap_started"], ["pool", "swap_completed"]]
    assert all("a -> b" in r for r in rows)


async def test_tail_last_replays_the_most_recent_events(nc: NatsClient, prefix: str) -> None:
    """`tail --last 2 --json` starts with the two newest events already in the stream."""
    subjects = Subjects(prefix)
    stream = stream_name(prefix)
    await ensure_audit_stream(nc.jetstream(), AuditStreamSpec(name=stream, subjects=subjects))
    events = request_events(5)
    await publish_events(nc.jetstream(), subjects, events)
    proc = await asyncio.create_subprocess_exec(
        find_binary("hotseat"), "audit", "tail", "--nats-url", str(nc.connected_url.geturl()),
        "--subject-prefix", prefix, "--stream", stream, "--last", "2", "--count", "2", "--json",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0
    assert [json.loads(line)["id"] for line in out.splitlines()] == [e.id for e in events[3:]]


def test_since_takes_a_time_or_a_duration_ago() -> None:
    """--since accepts an ISO time as is, or a duration meaning that long ago."""
    assert _moment(T0.isoformat()) == T0.isoformat()
    ago = datetime.fromisoformat(_moment("2h"))
    assert abs((datetime.now(UTC) - ago) - timedelta(hours=2)) < timedelta(seconds=5)
    with pytest.raises(argparse.ArgumentTypeError):
        _moment("yesterday")
