"""One pool as this controller replica sees it: answers requests, supervises, runs swaps.

Everything durable is in Redis (:class:`~.store.pool.PoolStore`); what a replica keeps in
memory (its running swap tasks, a health-failure counter) any other replica can rebuild.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

from redis.exceptions import RedisError

from hotseat_common.config.model import Pool
from hotseat_common.errors import ErrorCode
from hotseat_common.logging import get_logger
from hotseat_common.messages import (
    AcquireRequest,
    ErrorReply,
    PoolOutcome,
    RenewRequest,
)
from hotseat_pool_controller.decisions.acquire import decide_acquire
from hotseat_pool_controller.decisions.admin import decide_admin_swap, decide_admin_unload
from hotseat_pool_controller.decisions.model import (
    NOTHING,
    AcquireAsk,
    AuditIntent,
    Decision,
    Phase,
    PoolPolicy,
    PoolSnapshot,
    Reply,
    SwapOrder,
)
from hotseat_pool_controller.decisions.recovery import (
    decide_rebuild,
    decide_resident_health,
    decide_resident_lost,
)
from hotseat_pool_controller.decisions.start import next_epoch
from hotseat_pool_controller.decisions.tick import decide_tick
from hotseat_pool_controller.drivers.base import DriverError, ResidencyDriver
from hotseat_pool_controller.events import Announcer
from hotseat_pool_controller.store.pool import ConflictError, PoolStore, Renewed
from hotseat_pool_controller.swap import SwapRunner

log = get_logger(__name__)

HEALTH_FAILURES_BEFORE_LOST = 2
IDLE_CHECK_TIMEOUT_S = 2.0
RELEARN_MARGIN_MS = 1000
"""Past one lease TTL, how long a rebuilt resident stays busy for renewals on their way."""

Decide = Callable[[PoolSnapshot, bool | None], Decision]


class PoolRuntime:
    def __init__(  # noqa: PLR0917 - wiring, called once per pool
        self,
        pool: Pool,
        policy: PoolPolicy,
        store: PoolStore,
        driver: ResidencyDriver,
        announcer: Announcer,
        controller: str,
    ) -> None:
        self.pool = pool
        self.policy = policy
        self.store = store
        self.driver = driver
        self.announcer = announcer
        self.controller = controller
        self.swaps: set[asyncio.Task[None]] = set()
        self.wake = asyncio.Event()
        self._health_failures = 0
        self._runner = SwapRunner(store, driver, policy, controller, self._after_step)

    @property
    def name(self) -> str:
        return self.policy.name

    # --- deciding ---------------------------------------------------------------------

    async def _slots_busy(self, member: str) -> bool:
        """Fail closed: a /slots check that errors or stalls counts as busy."""
        try:
            async with asyncio.timeout(IDLE_CHECK_TIMEOUT_S):
                return not await self.driver.is_idle(member)
        except (DriverError, TimeoutError) as exc:
            log.warning("idle_check_failed", pool=self.name, member=member, error=str(exc))
            return True

    async def _decide(self, decide: Decide, attempt: str = "") -> Decision:
        decision, _ = await self.store.decide(lambda s: decide(s, None), attempt)
        if decision.need_idle_check is not None:
            busy = await self._slots_busy(decision.need_idle_check)
            decision, _ = await self.store.decide(lambda s: decide(s, busy), attempt)
        await self._after_step(decision, "decision")
        return decision

    async def _after_step(self, decision: Decision, reason: str) -> None:
        for intent in decision.audit:
            self.announcer.audit(self.name, intent)
            self._count(intent)
        if decision.changes_state:
            snap = await self.store.snapshot()
            await self.announcer.state_changed(self.name, snap, reason)
        if decision.swap is not None:
            self._start_swap(decision.swap)

    def _count(self, intent: AuditIntent) -> None:
        metrics = self.announcer.metrics
        result = {
            PoolOutcome.SWAP_COMPLETED: "completed",
            PoolOutcome.SWAP_FAILED: "failed",
            PoolOutcome.SWAP_CANCELLED: "cancelled",
        }.get(intent.outcome)
        if result is not None:
            metrics.swaps.labels(
                self.name, intent.from_member or "", intent.to_member or "", result
            ).inc()
        if intent.outcome == PoolOutcome.RESIDENT_LOST:
            metrics.residents_lost.labels(self.name, intent.member or "").inc()

    def _start_swap(self, order: SwapOrder) -> None:
        task = asyncio.create_task(self._run_swap(order), name=f"swap-{self.name}-{order.epoch}")
        self.swaps.add(task)
        task.add_done_callback(self.swaps.discard)

    async def _run_swap(self, order: SwapOrder) -> None:
        started = time.monotonic()
        try:
            result = await self._runner.run(order)
        except asyncio.CancelledError:
            log.info("swap_task_stopped", pool=self.name, epoch=order.epoch)
            raise
        finally:
            self.wake.set()
        self.announcer.metrics.swap_duration.labels(self.name, order.target, result).observe(
            time.monotonic() - started
        )

    # --- requests ---------------------------------------------------------------------

    async def acquire(self, request: AcquireRequest) -> Reply:
        lease_id = uuid.uuid4().hex
        fast = await self.store.grant_if_resident(
            request.member,
            lease_id,
            request.attempt,
            request.router,
            request_id=request.request_id,
        )
        if fast is not None:
            self.announcer.metrics.acquires.labels(self.name, request.member, fast.status).inc()
            return fast

        def decide(snap: PoolSnapshot, slots_busy: bool | None) -> Decision:
            ask = AcquireAsk.of(request, now_ms=snap.now_ms, lease_id=lease_id)
            return decide_acquire(snap, ask, self.policy, self.controller, slots_busy=slots_busy)

        decision = await self._decide(decide, request.attempt)
        reply = decision.reply or ErrorReply(code=ErrorCode.INTERNAL_ERROR, message="no decision")
        self.announcer.metrics.acquires.labels(self.name, request.member, reply.status).inc()
        return reply

    async def release(self, member: str, lease_id: str) -> bool:
        released = await self.store.release(member, lease_id)
        if released.may_move:
            self.wake.set()
        return released.removed

    async def renew(self, request: RenewRequest) -> Renewed:
        return await self.store.renew(
            request.member,
            request.lease_id,
            epoch=request.epoch,
            attempt=request.attempt,
            request_id=request.request_id,
            router=request.router,
        )

    async def cancel(self, member: str, attempt: str) -> bool:
        removed = await self.store.cancel(member, attempt)
        self.wake.set()
        return removed

    async def report_failure(self, member: str, reason: str) -> None:
        log.warning("dispatch_failure_reported", pool=self.name, member=member, reason=reason)
        await self.check_resident(threshold=1)

    async def admin_swap(self, member: str, *, force: bool = False) -> Decision:
        """``force``: do not consult the incumbent's /slots (its leases still count)."""
        return await self._decide(
            lambda s, busy: decide_admin_swap(
                s, member, self.controller, self.policy, slots_busy=False if force else busy
            )
        )

    async def admin_unload(self, *, force: bool = False) -> Decision:
        return await self._decide(
            lambda s, busy: decide_admin_unload(
                s, self.controller, self.policy, slots_busy=False if force else busy
            )
        )

    # --- supervision ------------------------------------------------------------------

    async def tick(self, *, reap: bool = True) -> None:
        """Reap (on the timer), then move the pool forward (one replica wins each transition)."""
        snap = await self.store.snapshot()
        if snap.phase == Phase.UNKNOWN:
            await self.rebuild()
            return
        self.announcer.observe(self.name, snap)
        if reap:
            await self._reap()
        elif decide_tick(snap, self.policy, self.controller) is NOTHING:
            return  # woken by a release or a cancel, and there is nothing to move
        await self._decide(
            lambda s, busy: decide_tick(s, self.policy, self.controller, slots_busy=busy)
        )

    async def _reap(self) -> None:
        for lease in await self.store.reap():
            self.announcer.metrics.lease_expiries.labels(self.name, lease.member).inc()
            self.announcer.audit(
                self.name,
                AuditIntent(
                    PoolOutcome.LEASE_EXPIRED,
                    member=lease.member,
                    request_id=lease.request_id,
                    reason=f"not renewed by router {lease.router}",
                ),
            )

    async def rebuild(self) -> None:
        """The state is gone (Redis restarted empty) or was written on another server (a
        restart with persistence, a failover): re-derive residency from the driver, and
        relearn who is busy (docs/adr/0005). A lone member on the GPU is the resident even
        when it does not answer yet (still loading, or stalled under its streams): marked
        unhealthy, it is never taken for gone and unloaded on that alone. The drivers are
        fenced at the new epoch first, so a swap owner that lost the pool with its state
        cannot act on its old claim."""
        snap = await self.store.snapshot()
        if snap.phase != Phase.UNKNOWN:
            return
        await self.driver.fence(next_epoch(snap))
        loaded = await self.driver.residency()
        on_gpu = tuple(m for m, is_loaded in loaded.items() if is_loaded)
        unhealthy = len(on_gpu) == 1 and not await self.driver.is_ready(on_gpu[0])
        log.warning("pool_state_rebuilt", pool=self.name, loaded=loaded, unhealthy=unhealthy)
        self.announcer.metrics.store_relearns.labels(self.name).inc()
        relearn_ms = self.policy.lease_ttl_ms + RELEARN_MARGIN_MS
        await self._decide(
            lambda s, _busy: decide_rebuild(s, on_gpu, unhealthy=unhealthy, relearn_ms=relearn_ms)
        )

    async def check_resident(self, threshold: int = HEALTH_FAILURES_BEFORE_LOST) -> None:
        """Health-check the resident. One that fails ``threshold`` checks in a row is lost,
        unless it serves: then it is lost only if the driver confirms it gone (its leases
        revoked), else marked unhealthy until its leases end (docs/adr/0005)."""
        snap = await self.store.snapshot()
        if snap.resident is None or snap.phase not in {Phase.IDLE, Phase.DRAINING}:
            self._health_failures = 0
            return
        resident = snap.resident
        if await self.driver.is_ready(resident):
            self._health_failures = 0
            if snap.unhealthy:
                log.info("resident_healthy_again", pool=self.name, member=resident)
                await self._decide(
                    lambda s, _busy: decide_resident_health(s, resident, healthy=True)
                )
            return
        self._health_failures += 1
        if self._health_failures < threshold:
            return
        self._health_failures = 0
        if not snap.serving(resident):
            await self._decide(
                lambda s, _busy: decide_resident_lost(s, resident, "health check failed")
            )
            return
        if await self.driver.confirm_gone(resident):
            log.warning("resident_gone_while_serving", pool=self.name, member=resident,
                        leases=snap.live_leases(resident))  # fmt: skip
            await self._decide(
                lambda s, _busy: decide_resident_lost(
                    s, resident, "gone while serving: leases revoked", revoke=True
                )
            )
            return
        if not snap.unhealthy:
            log.warning("resident_unhealthy", pool=self.name, member=resident,
                        leases=snap.live_leases(resident))  # fmt: skip
            self.announcer.metrics.residents_unhealthy.labels(self.name, resident).inc()
        await self._decide(lambda s, _busy: decide_resident_health(s, resident, healthy=False))

    async def supervise(self, tick_interval: float, reconcile_interval: float) -> None:
        """Tick on every local trigger and on a timer; check the resident periodically."""
        next_health = time.monotonic()
        next_reap = time.monotonic()
        while True:
            try:
                async with asyncio.timeout(tick_interval):
                    await self.wake.wait()
            except TimeoutError:
                pass
            self.wake.clear()
            try:
                reap = time.monotonic() >= next_reap
                if reap:
                    next_reap = time.monotonic() + tick_interval
                await self.tick(reap=reap)
                if time.monotonic() >= next_health:
                    next_health = time.monotonic() + reconcile_interval
                    await self.check_resident()
            except RedisError as exc:
                log.warning("supervisor_store_unreachable", pool=self.name, error=str(exc))
            except DriverError as exc:
                log.warning("supervisor_driver_error", pool=self.name, error=str(exc))
            except ConflictError as exc:
                # Heavy contention (leases coming and going on the resident) made every
                # attempt's precondition break; the next tick decides afresh. Not fatal.
                log.warning("supervisor_decision_contended", pool=self.name, error=str(exc))
