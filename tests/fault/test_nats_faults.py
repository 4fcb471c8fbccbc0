"""Fault test: NATS killed and restarted under traffic (guarantee 7 of
docs/reliability.md)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest

from hotseat.launcher import Managed, free_port, start_nats
from tests.audit.support import raw_rows
from tests.fault.conftest import MakeFaultStack
from tests.support.audit_trail import audit_publishing
from tests.support.clients import chat
from tests.support.procs import kill
from tests.support.stack import pool_stack_config
from tests.support.waiting import eventually

pytestmark = pytest.mark.fault

DOWN_S = 1.5


async def test_nats_restart_is_survived_without_losing_acked_audit_events(
    make_stack: MakeFaultStack, tmp_path: Path
) -> None:
    """NATS SIGKILLed and restarted (same port, same JetStream store) under traffic through
    two routers: both routers serve pooled requests again within seconds of the restart,
    and every audit event that JetStream acknowledged, and every request a client got an
    answer for, is stored exactly once."""
    port = free_port()
    nats = start_nats(tmp_path / "nats", port=port)
    try:
        stack = make_stack(pool_stack_config(pool={"leaseTtl": "3s"}))
        stack.nats_url = nats.url
        dsn = f"sqlite:///{tmp_path / 'audit.db'}"
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
                await asyncio.sleep(0.05)

        clients = [asyncio.create_task(client(n)) for n in range(4)]
        await asyncio.sleep(2)
        kill(nats)
        await asyncio.sleep(DOWN_S)
        nats = await asyncio.to_thread(start_nats, tmp_path / "nats", port=port)
        restarted = time.monotonic()
        recovered = []
        for router in routers:
            await eventually(lambda r=router: _serves(r.url), timeout=20, interval=0.1)
            recovered.append(time.monotonic() - restarted)
        await asyncio.sleep(1)
        stop.set()
        await asyncio.gather(*clients)
        assert max(recovered) < 5, f"routers took {recovered} s to serve again"
        statuses = Counter(answered.values())
        assert statuses[200] > 0, statuses
        # Every publisher has flushed: what JetStream acknowledged is in the store, once.
        procs = [*stack.routers, *stack.controllers.values()]
        totals = await eventually(lambda: _flushed(procs), timeout=30, interval=0.5)
        assert totals["dropped"] == 0, totals

        async def stored() -> list[tuple[object, ...]] | None:
            rows = await raw_rows(dsn, "SELECT id, request_id, kind FROM audit_events")
            return rows if len(rows) >= totals["published"] else None

        rows = await eventually(stored, timeout=30, interval=0.5)
        ids = [row[0] for row in rows]
        assert len(ids) == len(set(ids)), "an event was stored twice"
        assert len(rows) == totals["published"], (len(rows), totals)
        requests = Counter(row[1] for row in rows if row[2] == "request")
        missing = [rid for rid in answered if requests[rid] != 1]
        assert missing == [], f"answered requests without exactly one event: {missing[:10]}"
    finally:
        nats.stop()


async def _serves(url: str) -> bool:
    return (await chat(url, "judge", timeout=5)).status_code == 200


async def _flushed(procs: list[Managed]) -> dict[str, float] | None:
    totals = await audit_publishing(procs)
    return totals if totals["buffered"] == 0 else None
