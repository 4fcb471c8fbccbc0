"""Running swaps as their owner: unload everything else, confirm, load, commit.

No request can cancel a swap: it runs in the controller's own task, bounded only by the
pool's ``swapTimeout``. A heartbeat keeps the claim; when the claim is lost (another
replica took over with a newer epoch) the swap stops touching drivers at once: a driver
command under way is cancelled, and none starts after. Right before every driver command
the owner reads the pool state once more and stops if the swap is no longer its own, so a
controller that was frozen and thawed does not act on a stale claim; the drivers fence what
is left of that window at the backend (docs/drivers.md).

The heartbeat never cancels the swap anywhere else: every store step checks ownership
itself, and the swap's own last step (commit, cancel, fail) ends the claim, so a heartbeat
that reads the pool right after it must not cut the swap's announcements short.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from redis.exceptions import RedisError

from hotseat_common.logging import get_logger
from hotseat_common.messages import PoolOutcome
from hotseat_pool_controller.decisions.swap import (
    decide_begin_load,
    decide_commit,
    decide_fail,
    decide_heartbeat,
)
from hotseat_pool_controller.drivers.base import DriverError, ResidencyDriver
from hotseat_pool_controller.model import (
    NOTHING,
    Decision,
    Phase,
    PoolPolicy,
    PoolSnapshot,
    SwapOrder,
)
from hotseat_pool_controller.runtime.announcer import Announcer
from hotseat_pool_controller.runtime.outcomes import Outcomes
from hotseat_pool_controller.store.pool import PoolStore

log = get_logger(__name__)

UNLOAD_AFTER_FAILURE_TIMEOUT_S = 60.0

Step = Callable[[PoolSnapshot], Decision | None]


class OwnershipLost(Exception):
    """Another replica now owns this swap (newer epoch)."""


class _Claim:
    """One run's claim as its heartbeat last saw it. A loss cancels the driver command
    under way, if any, and refuses every later one; nothing else of the run is cut."""

    def __init__(self, work: asyncio.Task[object] | None) -> None:
        self._work = work
        self._driving = False
        self._cancelled = False
        self.lost = False

    def lose(self) -> None:
        self.lost = True
        if self._driving and self._work is not None and not self._cancelled:
            self._cancelled = True
            self._work.cancel()

    @contextlib.asynccontextmanager
    async def driving(self) -> AsyncIterator[None]:
        """Around a driver command: the heartbeat may cancel it (raised as OwnershipLost)."""
        if self.lost:
            raise OwnershipLost
        self._driving = True
        try:
            yield
        except asyncio.CancelledError:
            if not self._cancelled or self._work is None:
                raise
            self._cancelled = False
            self._work.uncancel()
            raise OwnershipLost from None
        finally:
            self._driving = False


class SwapRunner:
    def __init__(
        self,
        store: PoolStore,
        driver: ResidencyDriver,
        policy: PoolPolicy,
        controller: str,
        outcomes: Outcomes,
    ) -> None:
        self._store = store
        self._driver = driver
        self._policy = policy
        self._controller = controller
        self._outcomes = outcomes

    async def _step(self, step: Step, reason: str) -> Decision:
        """Apply one owner-only transition; raise OwnershipLost if it is not ours any more."""
        lost = False

        def decide(snap: PoolSnapshot) -> Decision:
            nonlocal lost
            decision = step(snap)
            lost = decision is None
            return decision or NOTHING

        decision, _ = await self._store.decide(decide)
        if lost:
            raise OwnershipLost
        await self._outcomes.report(decision, reason)
        return decision

    async def run(self, order: SwapOrder) -> str:
        """Run the swap; returns ``completed``, ``cancelled``, ``failed`` or ``lost``."""
        epoch = order.epoch
        result = "lost"
        snap = await self._store.snapshot()
        remaining = max(0.0, (snap.deadline_ms - snap.now_ms) / 1000)
        started = time.monotonic()
        log.info("swap_run", pool=self._policy.name, target=order.target, epoch=epoch,
                 resume=order.resume, budget_s=round(remaining, 3))  # fmt: skip
        claim = _Claim(asyncio.current_task())
        heartbeat = asyncio.create_task(
            self._heartbeat(epoch, claim), name=f"swap-heartbeat-{self._policy.name}-{epoch}"
        )
        try:
            try:
                async with asyncio.timeout(remaining):
                    await self._unload_others(order, claim)
                    await self._unload_target_if_unwanted(order, claim)
                    decision = await self._step(
                        lambda s: decide_begin_load(s, epoch, self._controller), "loading"
                    )
                    if decision.audit:  # cancelled: the demand left before the load began
                        result = "cancelled"
                        return result
                    if order.target:
                        await self._still_owner(order)
                        async with claim.driving():
                            await self._driver.load(order.target, epoch=epoch)
                    await self._step(lambda s: decide_commit(s, epoch, self._controller), "ready")
                    result = "completed"
            except (TimeoutError, DriverError) as exc:
                reason = "swap_timeout" if isinstance(exc, TimeoutError) else str(exc)
                await self._fail(order, reason, claim)
                result = "failed"
        except OwnershipLost:
            log.warning("swap_ownership_lost", pool=self._policy.name, epoch=epoch)
        except RedisError as exc:
            # The store is unreachable: stop here; the heartbeat lapses and a replica that
            # can reach Redis takes the swap over from the unload step.
            log.error("swap_store_unreachable", pool=self._policy.name, epoch=epoch, error=str(exc))  # noqa: TRY400
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            log.info("swap_run_done", pool=self._policy.name, target=order.target, epoch=epoch,
                     result=result, seconds=round(time.monotonic() - started, 3))  # fmt: skip
        return result

    async def _still_owner(self, order: SwapOrder) -> None:
        """Raise :class:`OwnershipLost` unless the swap is still ours (read just now)."""
        snap = await self._store.snapshot()
        if snap.epoch != order.epoch or snap.owner != self._controller:
            raise OwnershipLost

    async def _unload_others(self, order: SwapOrder, claim: _Claim) -> None:
        others = [m for m in self._policy.members if m != order.target]
        await self._still_owner(order)
        async with claim.driving():
            await asyncio.gather(*(self._driver.unload(m, epoch=order.epoch) for m in others))

    async def _unload_target_if_unwanted(self, order: SwapOrder, claim: _Claim) -> None:
        """About to cancel for lack of demand (still ``unloading``: this swap has not begun
        the target's load): the target may hold memory all the same (a load left over from
        a controller that lost the store, a Redis that lost its state), so unload it while
        still owning the swap. If demand arrives meanwhile, the load simply runs after all."""
        snap = await self._store.snapshot()
        if snap.phase == Phase.LOADING:
            return  # the target's load began (under an earlier owner): it runs to completion
        if not order.target or snap.forced or snap.live_waiters(order.target) > 0:
            return
        await self._still_owner(order)
        async with claim.driving():
            await self._driver.unload(order.target, epoch=order.epoch)

    async def _fail(self, order: SwapOrder, reason: str, claim: _Claim) -> None:
        log.error(PoolOutcome.SWAP_FAILED, pool=self._policy.name, target=order.target,
                  epoch=order.epoch, reason=reason)  # fmt: skip
        await self._still_owner(order)
        if order.target:
            try:
                async with asyncio.timeout(UNLOAD_AFTER_FAILURE_TIMEOUT_S), claim.driving():
                    await self._driver.unload(order.target, epoch=order.epoch)
            except (TimeoutError, DriverError) as exc:
                log.error("swap_failed_unload_failed", pool=self._policy.name,  # noqa: TRY400
                          target=order.target, error=str(exc))  # fmt: skip
        await self._step(
            lambda s: decide_fail(s, self._policy, order.epoch, self._controller, reason),
            PoolOutcome.SWAP_FAILED,
        )

    async def _heartbeat(self, epoch: int, claim: _Claim) -> None:
        interval = self._policy.heartbeat_ttl_ms / 3000
        while True:
            await asyncio.sleep(interval)
            lost = False

            def decide(snap: PoolSnapshot) -> Decision:
                nonlocal lost
                decision = decide_heartbeat(snap, self._policy, epoch, self._controller)
                lost = decision is None
                return decision or NOTHING

            try:
                await self._store.decide(decide)
            except RedisError as exc:
                log.warning("swap_heartbeat_failed", pool=self._policy.name, error=str(exc))
                continue
            if lost:
                claim.lose()
                return


class Swaps:
    """The swaps this replica owns for one pool, each in its own task that no request can
    cancel; the pool's supervisor is woken when one ends."""

    def __init__(
        self, runner: SwapRunner, announcer: Announcer, pool: str, wake: asyncio.Event
    ) -> None:
        self._runner = runner
        self._announcer = announcer
        self._pool = pool
        self._wake = wake
        self.tasks: set[asyncio.Task[None]] = set()

    def start(self, order: SwapOrder) -> None:
        task = asyncio.create_task(self._run(order), name=f"swap-{self._pool}-{order.epoch}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, order: SwapOrder) -> None:
        started = time.monotonic()
        try:
            result = await self._runner.run(order)
        except asyncio.CancelledError:
            log.info("swap_task_stopped", pool=self._pool, epoch=order.epoch)
            raise
        finally:
            self._wake.set()
        self._announcer.swap_ran(self._pool, order.target, result, time.monotonic() - started)
