"""Fault test: NATS killed and restarted under traffic (guarantee 7 of
docs/reliability.md)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient

from hotseat.launcher import free_port, start_nats
from hotseat_common.connections import open_nats
from hotseat_common.subjects import AUDIT_DURABLE
from tests.audit.support import (
    drop_schema,
    fill_history,
    postgres_schema_dsn,
    raw_rows,
)
from tests.fault.conftest import MakeFaultStack
from tests.support.audit_trail import publishers_flushed, store_caught_up, stream_events
from tests.support.clients import chat
from tests.support.procs import kill
from tests.support.stack import pool_stack_config
from tests.support.waiting import eventually

pytestmark = pytest.mark.fault

DOWN_S = 1.5


async def test_nats_restart_is_survived_without_losing_acked_audit_events(
    make_stack: MakeFaultStack, tmp_path: Path, prefix: str, postgres_dsn: str
) -> None:
    """NATS SIGKILLed and restarted (same port, same JetStream store) under traffic through
    two routers: both routers serve pooled requests again after the restart (how soon:
    bench/fault_timings.py), and every audit event that JetStream acknowledged, and every
    request a client got an answer for, is stored exactly once."""
    port = free_port()
    nats = start_nats(tmp_path / "nats", port=port)
    try:
        stack = make_stack(pool_stack_config(pool={"leaseTtl": "3s"}))
        stack.nats_url = nats.url
        # The audit store is PostgreSQL already holding a week of events, as in service.
        dsn = postgres_schema_dsn(postgres_dsn, prefix)
        history = await fill_history(dsn)
        stack.start_sims()
        stack.start_controller("c1")
        stack.start_controller("c2")
        routers = [stack.start_router(), stack.start_router()]
        stack.start_audit(dsn)
        await stack.wait_resident("judge")
        answered: dict[str, int] = {}
        stop = asyncio.Event()

        async def client(n: int) -> None:
            i = 0
            while not stop.is_set():
                request_id = f"c{n}-{i}"
                i += 1
                router = routers[i % 2]
                try:
                    response = await chat(router.url, "judge", request_id=request_id, timeout=40)
                except OSError:
                    continue
                answered[request_id] = response.status_code
                await asyncio.sleep(0.05)  # think time between one client's requests

        clients = [asyncio.create_task(client(n)) for n in range(4)]
        await eventually(lambda: _served(answered, 20), timeout=30)  # traffic before the kill
        kill(nats)
        await asyncio.sleep(DOWN_S)  # the outage itself: NATS stays down this long
        nats = await asyncio.to_thread(start_nats, tmp_path / "nats", port=port)
        for router in routers:
            await eventually(lambda r=router: _serves(r.url), timeout=30, interval=0.1)
        before = len(answered)
        await eventually(lambda: _served(answered, before + 20), timeout=30)  # and after it
        stop.set()
        await asyncio.gather(*clients)
        statuses = Counter(answered.values())
        assert statuses[200] > 0, statuses
        # Every publisher has flushed, and the store has caught up with the stream: every
        # event JetStream holds (acknowledged; de-duplicated by event id) is stored.
        totals = await publishers_flushed(stack.publishers())
        assert totals["dropped"] == 0, totals
        trail = await stream_events(nats.url, f"AUDIT_{prefix}", f"{prefix}.audit.>")
        assert len(trail) >= totals["published"], (len(trail), totals)
        async with _nats(nats.url) as nc:
            await store_caught_up(nc.jetstream(), f"AUDIT_{prefix}", AUDIT_DURABLE)
        rows = await raw_rows(dsn, "SELECT id, request_id, kind FROM audit_events")
        stored = {row[0]: row for row in rows if not str(row[1]).startswith("history-")}
        assert len(rows) - len(stored) == history, "history rows went missing"
        assert {e["id"] for e in trail} <= set(stored), "an acknowledged event is not stored"
        # Exactly once per request: a retried publish under a new id would count twice.
        requests = Counter(row[1] for row in stored.values() if row[2] == "request")
        missing = [rid for rid in answered if requests[rid] != 1]
        assert missing == [], f"answered requests without exactly one event: {missing[:10]}"
        await stack.assert_invariants()
    finally:
        nats.stop()
        drop_schema(postgres_dsn, prefix)


@asynccontextmanager
async def _nats(url: str) -> AsyncIterator[NatsClient]:
    nc = await open_nats(url, connect_timeout=2)
    try:
        yield nc
    finally:
        await nc.close()


async def _served(answered: dict[str, int], count: int) -> bool:
    return sum(1 for status in answered.values() if status == 200) >= count


async def _serves(url: str) -> bool:
    return (await chat(url, "judge", timeout=5)).status_code == 200
