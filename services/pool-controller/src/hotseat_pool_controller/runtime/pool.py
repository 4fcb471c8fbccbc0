"""One pool as this controller replica runs it: its parts, wired once, and its supervisor
loop (tick on every local trigger and on a timer, reap expired leases, check the
resident).

Everything durable is in Redis (:class:`~hotseat_pool_controller.store.pool.PoolStore`);
what a replica keeps in memory (its running swap tasks, a health-failure counter) any
other replica can rebuild.
"""

from __future__ import annotations

import asyncio
import time

from redis.exceptions import RedisError

from hotseat_common.config.model import Pool
from hotseat_common.logging import get_logger
from hotseat_common.tracing import NO_TRACING, Tracing
from hotseat_pool_controller.decisions.capacity import free_gib
from hotseat_pool_controller.decisions.tick import decide_tick
from hotseat_pool_controller.drivers.base import DriverError, ResidencyDriver
from hotseat_pool_controller.model import NOTHING, Phase, PoolPolicy
from hotseat_pool_controller.runtime.announcer import Announcer
from hotseat_pool_controller.runtime.answers import PoolAnswers
from hotseat_pool_controller.runtime.outcomes import Outcomes
from hotseat_pool_controller.runtime.recovery import Recovery
from hotseat_pool_controller.runtime.swaps import SwapRunner, Swaps
from hotseat_pool_controller.runtime.transitions import Transitions
from hotseat_pool_controller.store.pool import ConflictError, PoolStore

log = get_logger(__name__)


class PoolRuntime:
    def __init__(  # noqa: PLR0917 - wiring, called once per pool
        self,
        pool: Pool,
        policy: PoolPolicy,
        store: PoolStore,
        driver: ResidencyDriver,
        announcer: Announcer,
        controller: str,
        *,
        tracing: Tracing = NO_TRACING,
    ) -> None:
        self.pool = pool
        self.policy = policy
        self._store = store
        self._announcer = announcer
        self._controller = controller
        self._wake = asyncio.Event()
        outcomes = Outcomes(store, announcer)
        runner = SwapRunner(store, driver, policy, controller, outcomes, tracing=tracing)
        self.swaps = Swaps(runner, announcer, policy.name, self._wake)
        self._transitions = Transitions(store, driver, outcomes, self.swaps)
        self._recovery = Recovery(store, driver, self._transitions, announcer)
        self.answers = PoolAnswers(
            store,
            controller,
            transitions=self._transitions,
            recovery=self._recovery,
            announcer=announcer,
            wake=self._wake,
        )

    @property
    def name(self) -> str:
        return self.policy.name

    async def tick(self, *, reap: bool = True) -> None:
        """Reap (on the timer), then move the pool forward (one replica wins each transition)."""
        snap = await self._store.snapshot()
        if snap.phase == Phase.UNKNOWN:
            await self._recovery.rebuild()
            return
        free = free_gib(snap, self.policy) if self.policy.has_capacity else None
        self._announcer.observe(self.name, snap, free)
        if reap:
            for lease in await self._store.reap():
                self._announcer.lease_expired(self.name, lease)
        elif decide_tick(snap, self.policy, self._controller) is NOTHING:
            return  # woken by a release or a cancel, and there is nothing to move
        await self._transitions.decide(
            lambda s, busy: decide_tick(s, self.policy, self._controller, slots_busy=busy)
        )

    async def supervise(self, tick_interval: float, reconcile_interval: float) -> None:
        """Tick on every local trigger and on a timer; check the resident periodically."""
        next_health = time.monotonic()
        next_reap = time.monotonic()
        while True:
            try:
                async with asyncio.timeout(tick_interval):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                reap = time.monotonic() >= next_reap
                if reap:
                    next_reap = time.monotonic() + tick_interval
                await self.tick(reap=reap)
                if time.monotonic() >= next_health:
                    next_health = time.monotonic() + reconcile_interval
                    await self._recovery.check_resident()
            except RedisError as exc:
                log.warning("supervisor_store_unreachable", pool=self.name, error=str(exc))
            except DriverError as exc:
                log.warning("supervisor_driver_error", pool=self.name, error=str(exc))
            except ConflictError as exc:
                # Heavy contention (leases coming and going on the resident) made every
                # attempt's precondition break; the next tick decides afresh. Not fatal.
                log.warning("supervisor_decision_contended", pool=self.name, error=str(exc))
