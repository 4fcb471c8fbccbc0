"""The swap's heartbeat stops a swap whose claim was taken over, and only that swap.

A real swap runner against real Redis, NATS and two sim backends, with a heartbeat every
10 ms. The swap's own commit ends its claim, so the heartbeat that reads the pool next
finds it "not ours": that must not cut the swap short before it has announced the new
resident (found by reading the runner: the idle announcement was lost and the swap
counted as neither completed nor lost). A takeover during a load still stops the load at
once, and the swap ends as ``lost``. A swap retargeted before its load is timed for the
member it loaded."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass

import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry

from hotseat.launcher import Managed
from hotseat_common.audit_stream import AuditPublisher
from hotseat_common.config.model import PoolActivation
from hotseat_common.keys import Keys
from hotseat_common.messages import WaitReply
from hotseat_common.metrics import PoolMetrics
from hotseat_common.subjects import Subjects
from hotseat_pool_controller.decisions.acquire import decide_acquire
from hotseat_pool_controller.decisions.admin import decide_admin_swap
from hotseat_pool_controller.decisions.recovery import decide_rebuild
from hotseat_pool_controller.drivers import build_driver
from hotseat_pool_controller.model import (
    AcquireAsk,
    Decision,
    PoolPolicy,
    PoolSnapshot,
    SwapOrder,
)
from hotseat_pool_controller.runtime.announcer import Announcer
from hotseat_pool_controller.runtime.outcomes import Outcomes
from hotseat_pool_controller.runtime.swaps import SwapRunner, Swaps
from hotseat_pool_controller.store.link import RedisLink
from hotseat_pool_controller.store.pool import PoolStore
from tests.support.sim import SimHandle, run_sim, sim_pool_config
from tests.support.waiting import eventually

HEARTBEAT_TTL_S = 0.03  # a heartbeat every 10 ms: many land around the commit


class HeldAfterCommit(Announcer):
    """Holds the announcement of the committed swap until the heartbeat has read the
    pool after the commit (its task has ended), so that read cannot be missed."""

    async def state_changed(self, pool: str, snap: PoolSnapshot, reason: str) -> None:
        if reason == "ready":
            await eventually(self._heartbeat_ended, interval=0.005)
        await super().state_changed(pool, snap, reason)

    @staticmethod
    async def _heartbeat_ended() -> bool:
        return not any(
            getattr(t.get_coro(), "__qualname__", "") == "SwapRunner._heartbeat"
            for t in asyncio.all_tasks()
            if not t.done()
        )


@dataclass
class Rig:
    store: PoolStore
    swaps: Swaps
    registry: CollectorRegistry
    sims: dict[str, SimHandle]
    events: list[dict[str, object]]

    async def begin_swap(self, member: str) -> SwapOrder:
        decision, _ = await self.store.decide(
            lambda s: decide_admin_swap(s, member, "c1", self.store.policy)
        )
        assert decision.swap is not None, decision
        return decision.swap

    def swaps_ran(self, result: str, to_member: str = "b") -> float:
        """Swaps to ``to_member`` that ran to ``result`` (the swap-duration histogram's
        count)."""
        labels = {"pool": "gpu0", "to_member": to_member, "result": result}
        return (
            self.registry.get_sample_value("hotseat_pool_swap_duration_seconds_count", labels)
            or 0.0
        )


@pytest.fixture
async def rig(
    nc: NatsClient,
    link: RedisLink,
    prefix: str,
    redis_server: Managed,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Rig]:
    load_seconds = getattr(request, "param", 0.1)
    config = sim_pool_config({"a": {}, "b": {"loadSeconds": load_seconds}, "c": {}})
    pool = config.pools[0]
    policy = PoolPolicy.from_config(pool, heartbeat_ttl_s=HEARTBEAT_TTL_S)
    store = PoolStore(link, Keys(prefix), policy)
    await store.decide(lambda s: decide_rebuild(s, (), relearn_ms=0))
    registry = CollectorRegistry()
    metrics = PoolMetrics(registry)
    subjects = Subjects(prefix)
    announcer = HeldAfterCommit(
        nc, subjects, AuditPublisher(nc, subjects, metrics.audit_publish), metrics, "c1"
    )
    driver = build_driver(config, pool)
    runner = SwapRunner(store, driver, policy, "c1", Outcomes(store, announcer))
    events: list[dict[str, object]] = []

    async def record(msg: Msg) -> None:
        events.append(json.loads(msg.data))

    subscription = await nc.subscribe(subjects.pool_events("gpu0"), cb=record)
    async with AsyncExitStack() as stack:
        sims = {
            name: await stack.enter_async_context(
                run_sim(config, name, redis_url=redis_server.url, key_prefix=prefix)
            )
            for name in ("a", "b", "c")
        }
        yield Rig(store, Swaps(runner, announcer, "gpu0", asyncio.Event()), registry, sims, events)
        await subscription.unsubscribe()
        await driver.aclose()


async def run_to_end(swaps: Swaps, order: SwapOrder) -> asyncio.Task[None]:
    swaps.start(order)
    (task,) = swaps.tasks
    await asyncio.wait([task], timeout=30)
    assert task.done()
    return task


async def test_a_heartbeat_after_the_commit_does_not_cut_the_swap_short(rig: Rig) -> None:
    """The heartbeat finds the committed pool no longer in flight; the swap still
    announces its new resident and is counted as completed."""
    order = await rig.begin_swap("b")

    task = await run_to_end(rig.swaps, order)

    assert not task.cancelled(), "the heartbeat cancelled a swap that had committed"
    ready = await eventually(lambda: _first(rig.events, reason="ready"), timeout=5, interval=0.01)
    assert ready["resident"] == "b"
    assert rig.swaps_ran("completed") == 1
    assert (await rig.store.snapshot()).resident == "b"


@pytest.mark.parametrize("rig", [30.0], indirect=True)
async def test_a_takeover_during_the_load_stops_it_and_the_swap_ends_lost(
    rig: Rig, link: RedisLink, prefix: str
) -> None:
    """Another replica takes the swap over (its name in the state) while the 30-second
    load runs: the heartbeat stops the load at once and the swap ends as lost, counted."""
    order = await rig.begin_swap("b")
    rig.swaps.start(order)
    (task,) = rig.swaps.tasks
    await rig.sims["b"].wait_for_state("loading")

    await link.execute("HSET", Keys(prefix).pool_state("gpu0"), "owner", "c2")
    await asyncio.wait([task], timeout=15)

    assert task.done(), "the load went on after the swap was taken over"
    assert not task.cancelled()
    assert rig.swaps_ran("lost") == 1
    assert not _first_now(rig.events, reason="ready")


async def _first(events: list[dict[str, object]], **match: object) -> dict[str, object] | None:
    return _first_now(events, **match)


def _first_now(events: list[dict[str, object]], **match: object) -> dict[str, object] | None:
    return next((e for e in events if all(e.get(k) == v for k, v in match.items())), None)


async def test_a_retargeted_swap_is_timed_for_the_member_it_loaded(rig: Rig) -> None:
    """A swap started for a request for b, which a more urgent request for c (priority 5,
    held meanwhile) turns to before its load (docs/adr/0006): it loads c, and its
    duration is counted for c, not for b."""

    def asking(member: str, priority: int) -> Callable[[PoolSnapshot], Decision]:
        def decide(snap: PoolSnapshot) -> Decision:
            ask = AcquireAsk(
                member,
                PoolActivation.WAIT,
                f"attempt-{member}",
                f"request-{member}",
                "router-1",
                snap.now_ms + 60_000,
                f"lease-{member}",
                priority=priority,
                now_ms=snap.now_ms,
            )
            return decide_acquire(snap, ask, rig.store.policy, "c1")

        return decide

    for_b, _ = await rig.store.decide(asking("b", 0))
    assert for_b.swap is not None
    assert for_b.swap.target == "b"
    for_c, _ = await rig.store.decide(asking("c", 5))
    assert isinstance(for_c.reply, WaitReply)

    await run_to_end(rig.swaps, for_b.swap)

    assert (await rig.store.snapshot()).resident == "c"
    assert rig.swaps_ran("completed", to_member="c") == 1
    assert rig.swaps_ran("completed", to_member="b") == 0
