"""One pool as this controller replica runs it: its parts, wired once, and its supervisor
loop (tick on every local trigger and on a timer, reap expired leases, check the
resident).

The supervisor reads the pool only when a tick could decide something (docs/adr/0011):
after each tick it rests until the first moment one could decide something by itself
(:func:`~hotseat_pool_controller.decisions.tick.rest_for_ms`: a lease expiring, a
waiter giving up, a swap owner going silent, an idle unload falling due...), at least
``tick_interval`` and at most ``idle_tick_interval`` later, and checks the resident's
health from the driver alone meanwhile. What can move the pool before then here (an
acquire that left a waiter, a release that can move it, a cancel, any replica's state
change, a swap ending) wakes it at once; grants and renewals do not, unless the lease
would outlive the rest.

Everything durable is in Redis (:class:`~hotseat_pool_controller.store.pool.PoolStore`);
what a replica keeps in memory (its running swap tasks, a health-failure counter) any
other replica can rebuild.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from functools import partial

from redis.exceptions import RedisError

from hotseat_common.config.model import Pool
from hotseat_common.logging import get_logger
from hotseat_common.tracing import NO_TRACING, Tracing
from hotseat_pool_controller.decisions.capacity import free_gib
from hotseat_pool_controller.decisions.preload import Preloads, decide_preload, preload_left
from hotseat_pool_controller.decisions.tick import decide_tick, rest_for_ms
from hotseat_pool_controller.drivers.base import DriverError, ResidencyDriver
from hotseat_pool_controller.model import NOTHING, Phase, PoolPolicy, PoolSnapshot
from hotseat_pool_controller.runtime.announcer import Announcer
from hotseat_pool_controller.runtime.answers import PoolAnswers, Stir
from hotseat_pool_controller.runtime.outcomes import Outcomes
from hotseat_pool_controller.runtime.placement import CopyWriter
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
        self.stir = Stir(self._wake)
        self.ticks = 0
        """Ticks so far (each reads the pool): what a busy pool's supervision costs."""
        outcomes = Outcomes(store, announcer)
        runner = SwapRunner(store, driver, policy, controller, outcomes, tracing=tracing)
        self.swaps = Swaps(runner, announcer, policy.name, self._wake)
        self._transitions = Transitions(store, driver, outcomes, self.swaps)
        self._recovery = Recovery(store, driver, self._transitions, announcer)
        self.preloads = Preloads(policy.preload)
        """Members still to preload since this controller started, and those it preloaded
        (decisions/preload.py)."""
        self.copies: CopyWriter | None = None
        """Its entries in the group indexes, when model groups serve on it (docs/adr/0012)."""
        self.answers = PoolAnswers(
            store,
            controller,
            transitions=self._transitions,
            recovery=self._recovery,
            announcer=announcer,
            wake=self._wake,
            stir=self.stir,
            preloads=self.preloads,
        )

    def serve_groups(self, copies: CopyWriter) -> None:
        """Model groups serve on this pool: keep its entries in their indexes, and give
        each read of the pool the members that are copies beyond demand (a capacity
        pool evicts them first, docs/adr/0012)."""
        self.copies = copies
        self._store.surplus = partial(copies.surplus, self.name)
        if self.policy.has_capacity:
            self.stir.copies = copies.members
        else:
            self.answers.copies = copies

    @property
    def name(self) -> str:
        return self.policy.name

    async def tick(self, *, reap: bool = True) -> PoolSnapshot | None:
        """Reap (on the timer), then move the pool forward (one replica wins each
        transition). Returns the state read, when nothing was changed since (no lease
        reaped, nothing decided): what the supervisor may sleep on."""
        snap = await self._store.snapshot(deadlines=True)
        if snap.phase == Phase.UNKNOWN:
            await self._recovery.rebuild()
            return None
        free = free_gib(snap, self.policy) if self.policy.has_capacity else None
        self._announcer.observe(self.name, snap, free)
        if self.copies is not None:
            await self.copies.observe(self.name, snap, self.policy)
        reaped = await self._store.reap() if reap else []
        for lease in reaped:
            self._announcer.lease_expired(self.name, lease)
        self.preloads.seen(snap)
        if not reaped and decide_tick(snap, self.policy, self._controller) is NOTHING:
            if self.preloads.pending:
                return await self._preload_step(snap)
            return snap  # nothing expired and nothing to move
        await self._transitions.decide(
            lambda s, busy: decide_tick(s, self.policy, self._controller, slots_busy=busy)
        )
        return None

    async def _preload_step(self, snap: PoolSnapshot) -> PoolSnapshot | None:
        """A pool nothing else moves loads its next preload member, if one fits."""
        preloads = self.preloads
        preloads.pending = preload_left(snap, self.policy, preloads.pending)
        if decide_preload(snap, self.policy, self._controller, preloads.pending) is NOTHING:
            return None if preloads.pending else snap  # still to come: tick again soon
        decision = await self._transitions.decide(
            lambda s, _busy: decide_preload(s, self.policy, self._controller, preloads.pending)
        )
        preloads.started(decision)
        return None

    async def supervise(
        self, tick_interval: float, reconcile_interval: float, idle_interval: float = 5.0
    ) -> None:
        """Tick on every local trigger and on a timer (resting between ticks for as long
        as nothing can fall due, ``idle_interval`` at most); check the resident every
        ``reconcile_interval``."""
        plan = _Plan(tick_interval, reconcile_interval, idle_interval)
        while True:
            try:
                async with asyncio.timeout(plan.wait()):
                    await self._wake.wait()
            except TimeoutError:
                pass
            woken = self._wake.is_set()
            self._wake.clear()
            try:
                await self._step(plan, woken=woken)
            except RedisError as exc:
                log.warning("supervisor_store_unreachable", pool=self.name, error=str(exc))
            except DriverError as exc:
                log.warning("supervisor_driver_error", pool=self.name, error=str(exc))
            except ConflictError as exc:
                # Heavy contention (leases coming and going on the resident) made every
                # attempt's precondition break; the next tick decides afresh. Not fatal.
                log.warning("supervisor_decision_contended", pool=self.name, error=str(exc))
            plan.rest_until = self.stir.rest(plan.rest_until)
            if plan.rest_until is None:
                plan.snap = None

    async def _step(self, plan: _Plan, *, woken: bool) -> None:
        """One turn of the supervisor: a tick (or, resting and not woken, only the health
        check), then the health check when it is due."""
        now = time.monotonic()
        if plan.rest_until is not None and not woken and now < plan.rest_until:
            # Resting, and only the health check is due: the driver alone.
            plan.next_health = now + plan.reconcile_interval
            await self._recovery.check_resident(known=plan.snap)
            return
        self.ticks += 1
        reap = plan.rest_until is not None or now >= plan.next_reap
        if reap:
            plan.next_reap = now + plan.tick_interval
        plan.rest_until = plan.snap = None
        stirs = self.stir.begin()
        snap = await self.tick(reap=reap)
        rest = rest_for_ms(snap, self.policy, self._controller) if snap else None
        if snap is not None:
            self.stir.serving = snap.serving(snap.resident)
        if rest is not None and self.stir.stirs == stirs:
            plan.snap = snap
            plan.rest_until = now + min(plan.idle_interval, max(plan.tick_interval, rest / 1000))
        if time.monotonic() >= plan.next_health:
            plan.next_health = time.monotonic() + plan.reconcile_interval
            await self._recovery.check_resident(known=plan.snap)


@dataclass(slots=True)
class _Plan:
    """When a pool's supervisor next reaps, ticks and checks the resident."""

    tick_interval: float
    reconcile_interval: float
    idle_interval: float
    next_reap: float = field(default_factory=time.monotonic)
    next_health: float = field(default_factory=time.monotonic)
    rest_until: float | None = None
    """Set while the supervisor rests: its next tick (earlier if woken)."""
    snap: PoolSnapshot | None = None
    """The pool as the tick before the rest read it."""

    def wait(self) -> float:
        if self.rest_until is None:
            return self.tick_interval
        return max(0.0, min(self.rest_until, self.next_health) - time.monotonic())
