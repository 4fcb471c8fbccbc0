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

Prompt caches (docs/adr/0007): with a driver that carries them, a member's slots are saved
right before its unload, only while it is provably idle (no live lease in the snapshot
read just before, and the driver finds its ``/slots`` idle), and the target's slots are
restored after its load and before the commit, so before the first grant. A save or
restore that fails is reported and counted, never fails the swap; the terminal event of
the swap carries the figures.

Under ``busySignal: leasesAndSlots`` the owner reads the ``/slots`` of every member it is
about to unload (the evicts of a plan, the resident, a member a failed unload left
loaded: whatever the state says of them), right before the unloads: a member at work,
even for traffic that bypasses the router, is not unloaded, and the swap ends unloading
nothing (``decide_unloads_refused``); the pool tries again once it is idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import NamedTuple

from redis.exceptions import RedisError

from hotseat_common import tracing as spans
from hotseat_common.config.model import BusySignal
from hotseat_common.logging import get_logger
from hotseat_common.messages import SWAP_ENDINGS, PoolOutcome
from hotseat_common.tracing import NO_TRACING, Span, Tracing
from hotseat_pool_controller.decisions.capacity import pending_targets
from hotseat_pool_controller.decisions.swap import (
    decide_begin_load,
    decide_commit,
    decide_fail,
    decide_heartbeat,
    decide_lost_swap_end,
    decide_target_failed,
    decide_target_loaded,
    decide_unloads_refused,
    retargeted_to,
)
from hotseat_pool_controller.drivers.base import (
    NOT_RUNNING,
    CacheFailure,
    CacheReport,
    CarriesCaches,
    DriverError,
    ResidencyDriver,
    SlotFailure,
)
from hotseat_pool_controller.model import (
    NOTHING,
    CacheFigures,
    Decision,
    Phase,
    PoolPolicy,
    PoolSnapshot,
    SwapOrder,
)
from hotseat_pool_controller.runtime.announcer import Announcer
from hotseat_pool_controller.runtime.outcomes import Outcomes
from hotseat_pool_controller.runtime.slots import slots_busy
from hotseat_pool_controller.store.pool import PoolStore

log = get_logger(__name__)

UNLOAD_AFTER_FAILURE_TIMEOUT_S = 60.0
LOST_SWAP_POLL_S = 0.5
"""How often the owner of a swap lost while its claim held reads the pool until its state
is known again (:meth:`SwapRunner.end_lost`)..."""
LOST_SWAP_PATIENCE_S = 600.0
"""... and for how long at most: a store down longer leaves the swap without its end in
the audit (logged as ``swap_end_unknown``)."""

Step = Callable[[PoolSnapshot], Decision | None]


class _CacheTally:
    """The prompt-cache figures of one run of a swap, for its terminal event."""

    def __init__(self) -> None:
        self.figures: CacheFigures | None = None

    def add(self, report: CacheReport) -> None:
        seen = self.figures or CacheFigures()
        ms = report.seconds * 1000
        if report.action == "save":
            self.figures = replace(
                seen,
                saved_bytes=seen.saved_bytes + report.bytes,
                saved_tokens=seen.saved_tokens + report.tokens,
                save_ms=seen.save_ms + ms,
            )
        else:
            self.figures = replace(
                seen,
                restored_bytes=seen.restored_bytes + report.bytes,
                restored_tokens=seen.restored_tokens + report.tokens,
                restore_ms=seen.restore_ms + ms,
            )

    def attach(self, decision: Decision) -> Decision:
        """``decision`` with the figures on its swap-ending event, if it has one."""
        if self.figures is None or not decision.audit:
            return decision
        audit = tuple(
            replace(intent, cache=self.figures) if intent.outcome in SWAP_ENDINGS else intent
            for intent in decision.audit
        )
        return replace(decision, audit=audit)


class SwapRan(NamedTuple):
    """How a swap ended, and the member it was for at the end: a swap retargeted before
    its load (docs/adr/0006) ran for its new target, not the one it started with."""

    result: str
    """``completed``, ``cancelled``, ``failed`` or ``lost``."""
    target: str
    claim_held: bool = False
    """``lost`` while its claim still held, as its last heartbeat wrote it: no other replica
    can have taken the swap over, so the store lost it or could not be reached (its owner
    then reads the pool again: :meth:`SwapRunner.end_lost`)."""


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
        self.held_until = 0.0
        """Until when (the event loop's clock) the claim holds for sure: the expiry the
        owner's last read or heartbeat saw in the store, counted from before that call."""

    def confirmed(self, asked_at: float, left_ms: int) -> None:
        """A call sent at ``asked_at`` found the claim with ``left_ms`` to live."""
        self.held_until = max(self.held_until, asked_at + left_ms / 1000)

    @property
    def holds(self) -> bool:
        return asyncio.get_running_loop().time() <= self.held_until

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
        *,
        tracing: Tracing = NO_TRACING,
    ) -> None:
        self._tracing = tracing
        self._store = store
        self._driver = driver
        self._policy = policy
        self._controller = controller
        self._outcomes = outcomes
        self._caches = driver if isinstance(driver, CarriesCaches) else None

    async def _step(self, step: Step, reason: str, tally: _CacheTally | None = None) -> Decision:
        """Apply one owner-only transition; raise OwnershipLost if it is not ours any more."""
        lost = False

        def decide(snap: PoolSnapshot) -> Decision:
            nonlocal lost
            decision = step(snap)
            lost = decision is None
            return decision or NOTHING

        decision, after = await self._store.decide(decide)
        if lost:
            raise OwnershipLost
        if tally is not None:
            decision = tally.attach(decision)
        await self._outcomes.report(decision, after, reason)
        return decision

    async def run(self, order: SwapOrder, *, claimed_at: float | None = None) -> SwapRan:
        """Run the swap; returns how it ended (``completed``, ``cancelled``, ``failed`` or
        ``lost``) and for which member. Its span (when tracing is on) continues the trace
        of the acquire that started it. ``claimed_at``: when (the event loop's clock) the
        decision that claimed the swap was asked for, before its read: the claim it wrote
        lives at least a heartbeat TTL from then."""
        about = {
            spans.SWAP_ID: order.swap_id or None,
            spans.POOL: self._policy.name,
            spans.MEMBER: order.target or None,
            spans.EPOCH: order.epoch,
        }
        with self._tracing.span(spans.SWAP_SPAN, about) as span:
            ran = await self._run(order, claimed_at)
            span.set(spans.RESULT, ran.result)
            return ran

    def _driving(self, name: str, member: str, order: SwapOrder) -> AbstractContextManager[Span]:
        """The span of one driver command of the swap."""
        about = {spans.SWAP_ID: order.swap_id or None, spans.MEMBER: member}
        return self._tracing.span(name, about)

    async def _run(self, order: SwapOrder, claimed_at: float | None) -> SwapRan:
        epoch = order.epoch
        result = "lost"
        claim = _Claim(asyncio.current_task())
        if claimed_at is not None:
            claim.confirmed(claimed_at, self._policy.heartbeat_ttl_ms)
        started = time.monotonic()
        tally = _CacheTally()
        heartbeat = asyncio.create_task(
            self._heartbeat(epoch, claim), name=f"swap-heartbeat-{self._policy.name}-{epoch}"
        )
        try:
            try:
                remaining = await self._begin(order, claim)
                async with asyncio.timeout(remaining):
                    others = await self._to_unload(order)
                    unloaded: tuple[str, ...] = ()
                    busy = await self._at_work(order, claim, others)
                    if not busy:
                        unloaded = await self._unload_others(order, others, claim, tally)
                        busy = await self._unload_target_if_unwanted(order, claim)
                    if busy:
                        await self._refuse(order, busy, unloaded, tally)
                        result = "cancelled"
                        return SwapRan(result, order.target)
                    began = await self._begin_load(order, claim, tally, unloaded)
                    if isinstance(began, tuple):  # the old target of a retarget is at work
                        await self._refuse(order, began, unloaded, tally)
                    if not isinstance(began, SwapOrder):  # or the demand left before the load
                        result = "cancelled"
                        return SwapRan(result, order.target)
                    order = began
                    if order.target and not await self._load_several(order, claim, tally):
                        await self._still_owner(order)
                        with self._driving(spans.DRIVER_LOAD_SPAN, order.target, order):
                            async with claim.driving():
                                await self._driver.load(order.target, epoch=epoch)
                        await self._restore(order, claim, tally)
                    await self._step(
                        lambda s: decide_commit(s, epoch, self._controller, self._policy),
                        "ready",
                        tally,
                    )
                    result = "completed"
            except (TimeoutError, DriverError) as exc:
                reason = "swap_timeout" if isinstance(exc, TimeoutError) else str(exc)
                await self._fail(order, reason, claim, tally)
                result = "failed"
        except (OwnershipLost, RedisError) as exc:
            return self._lost(order, claim, exc)
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            log.info("swap_run_done", pool=self._policy.name, target=order.target, epoch=epoch,
                     swap_id=order.swap_id, result=result,
                     seconds=round(time.monotonic() - started, 3))  # fmt: skip
        return SwapRan(result, order.target)

    async def _begin(self, order: SwapOrder, claim: _Claim) -> float:
        """The pool as the run begins: the claim's expiry as the store has it, and what is
        left of the swap's budget (seconds)."""
        asked_at = asyncio.get_running_loop().time()
        snap = await self._store.snapshot()
        if snap.epoch == order.epoch and snap.owner == self._controller:
            claim.confirmed(asked_at, snap.heartbeat_ms - snap.now_ms)
        remaining = max(0.0, (snap.deadline_ms - snap.now_ms) / 1000)
        log.info("swap_run", pool=self._policy.name, target=order.target, epoch=order.epoch,
                 swap_id=order.swap_id, resume=order.resume,
                 budget_s=round(remaining, 3))  # fmt: skip
        return remaining

    def _lost(self, order: SwapOrder, claim: _Claim, exc: Exception) -> SwapRan:
        """The run stops: its claim is gone, or the store cannot be reached (then the
        heartbeat lapses and a replica that can reach Redis takes the swap over from the
        unload step). Whether the claim still held tells if another replica may own the
        swap now."""
        held = claim.holds
        about = {"pool": self._policy.name, "epoch": order.epoch, "swap_id": order.swap_id}
        if isinstance(exc, RedisError):
            log.error("swap_store_unreachable", claim_held=held, error=str(exc), **about)
        else:
            log.warning("swap_ownership_lost", claim_held=held, **about)
        return SwapRan("lost", order.target, claim_held=held)

    async def _refuse(
        self, order: SwapOrder, busy: tuple[str, ...], unloaded: tuple[str, ...], tally: _CacheTally
    ) -> None:
        """``busy`` was found at work right before its unload: the swap ends there."""
        await self._step(
            lambda s: decide_unloads_refused(
                s, self._policy, order.epoch, self._controller, busy, unloaded
            ),
            "busy",
            tally,
        )

    async def _begin_load(
        self, order: SwapOrder, claim: _Claim, tally: _CacheTally, unloaded: tuple[str, ...]
    ) -> SwapOrder | tuple[str, ...] | None:
        """Move to ``loading``, or retarget first (docs/adr/0006): while a more urgent
        member outranks the target, the swap takes it as its target, and the old target,
        which may hold memory (a load left over from a controller that lost the store), is
        unloaded like every other member before anything loads. Returns the order to load
        (its target the one the state now names), ``None`` when the swap was cancelled,
        or the old target when it was found at work (nothing loads)."""
        epoch, turns = order.epoch, len(self._policy.members)
        for turn in range(turns):

            def begin(snap: PoolSnapshot, retarget: bool = turn < turns - 1) -> Decision | None:
                # Bounded: at the last turn it loads whatever the target is then.
                return decide_begin_load(
                    snap, epoch, self._controller, self._policy, unloaded, retarget=retarget
                )

            decision = await self._step(begin, "loading", tally)
            moved = retargeted_to(decision)
            if moved is None:
                return None if decision.audit else order
            old, order = order.target, replace(order, target=moved)
            log.info("swap_retargeted", pool=self._policy.name, epoch=epoch,
                     swap_id=order.swap_id, old=old, target=moved)  # fmt: skip
            if busy := await self._at_work(order, claim, (old,)):
                return busy
            await self._unload_others(order, (old,), claim, tally)
        return order

    async def _load_several(self, order: SwapOrder, claim: _Claim, tally: _CacheTally) -> bool:
        """A capacity pool's plan that loads other members beside its target
        (docs/adr/0008): every target not yet loaded (a takeover resumes those its
        predecessor did not commit) loads at the same time, and each joins the set as soon
        as it is ready. One of the others that fails stays counted and the rest go on; the
        target's own failure fails the plan once the others ended. ``False``: a plan of
        one target, loaded as ever."""
        snap = await self._still_owner(order)
        if not self._policy.has_capacity or not snap.also:
            return False
        loads = pending_targets(snap)
        async with claim.driving():
            ended = await asyncio.gather(
                *(self._load_one(order, m, tally) for m in loads), return_exceptions=True
            )
        failures = [e for e in ended if isinstance(e, BaseException)]
        for error in failures:
            if not isinstance(error, DriverError):
                raise error
        if failures:
            raise failures[0]
        return True

    async def _load_one(self, order: SwapOrder, member: str, tally: _CacheTally) -> None:
        """Load one of several targets (the caller holds the claim's driving), restore its
        slots, and commit it alone; a member other than the plan's target that fails is
        recorded failed (a DriverError of the target itself is raised)."""
        epoch, controller, policy = order.epoch, self._controller, self._policy
        try:
            await self._still_owner(order)
            with self._driving(spans.DRIVER_LOAD_SPAN, member, order):
                await self._driver.load(member, epoch=epoch)
            if self._caches is not None and self._caches.carries(member):
                await self._still_owner(order)
                self._cache_step(await self._caches.restore_caches(member), tally)
        except DriverError as exc:
            if member == order.target:
                raise
            reason = str(exc)
            log.error("swap_target_failed", pool=policy.name, target=member, epoch=epoch,  # noqa: TRY400
                      reason=reason)  # fmt: skip
            await self._step(
                lambda s: decide_target_failed(s, policy, epoch, controller, member, reason),
                PoolOutcome.SWAP_FAILED,
                tally,
            )
            return
        await self._step(lambda s: decide_target_loaded(s, epoch, controller, member), "ready")

    async def _still_owner(self, order: SwapOrder) -> PoolSnapshot:
        """The pool read just now; :class:`OwnershipLost` unless the swap is still ours."""
        snap = await self._store.snapshot()
        if snap.epoch != order.epoch or snap.owner != self._controller:
            raise OwnershipLost
        return snap

    async def _to_unload(self, order: SwapOrder) -> tuple[str, ...]:
        """Every member but the target; in a capacity pool only the plan's evicts (as the
        state names them, the target too when a loss left it unconfirmed; a takeover in
        ``loading`` finds them confirmed gone), never a resident (docs/adr/0008)."""
        snap = await self._still_owner(order)
        if self._policy.has_capacity:
            return snap.evicts
        return tuple(m for m in self._policy.members if m != order.target)

    def _reads_slots(self, order: SwapOrder) -> bool:
        return self._policy.busy_signal == BusySignal.LEASES_AND_SLOTS and not order.over_slots

    async def _at_work(
        self, order: SwapOrder, claim: _Claim, members: tuple[str, ...]
    ) -> tuple[str, ...]:
        """Under ``busySignal: leasesAndSlots``, the members of ``members`` whose
        ``/slots`` answer that they are at work right now. One that does not answer is
        unloaded: a member the swap evicts from service was read idle (fail closed) by
        the decision that started it, and one out of service failed its health checks
        or its unload already (``decisions/busy.py``, ``at_work``)."""
        if not members or not self._reads_slots(order):
            return ()
        await self._still_owner(order)
        pool = self._policy.name
        async with claim.driving():
            busy = await asyncio.gather(*(slots_busy(self._driver, m, pool) for m in members))
        return tuple(m for m, b in zip(members, busy, strict=True) if b is True)

    async def _unload_others(
        self, order: SwapOrder, others: tuple[str, ...], claim: _Claim, tally: _CacheTally
    ) -> tuple[str, ...]:
        """Unload ``others`` (:meth:`_to_unload`), saving the slots of those that carry them."""
        snap = await self._still_owner(order)
        async with claim.driving():
            await asyncio.gather(*(self._save_then_unload(m, snap, order, tally) for m in others))
        return tuple(others)

    async def _save_then_unload(
        self, member: str, snap: PoolSnapshot, order: SwapOrder, tally: _CacheTally
    ) -> None:
        """Save ``member``'s slots if it carries them and is provably idle (no live lease in
        ``snap``, read right before; the driver checks its ``/slots``), then unload it."""
        if self._caches is not None and self._caches.carries(member):
            if snap.serving(member):
                report = CacheReport(
                    member, "save", failures=(SlotFailure(CacheFailure.BUSY, "live leases"),)
                )
            else:
                report = await self._caches.save_caches(member)
                await self._still_owner(order)  # the save took a while: still ours?
            self._cache_step(report, tally)
        with self._driving(spans.DRIVER_UNLOAD_SPAN, member, order):
            await self._driver.unload(member, epoch=order.epoch)

    async def _restore(self, order: SwapOrder, claim: _Claim, tally: _CacheTally) -> None:
        """The target is loaded and not yet resident: restore its slots before the commit."""
        if self._caches is None or not self._caches.carries(order.target):
            return
        await self._still_owner(order)
        async with claim.driving():
            report = await self._caches.restore_caches(order.target)
        self._cache_step(report, tally)

    def _cache_step(self, report: CacheReport, tally: _CacheTally) -> None:
        if report.note == NOT_RUNNING:
            return  # nothing was there to save or restore: no figure, no event
        tally.add(report)
        self._outcomes.cache_step(report)

    async def _unload_target_if_unwanted(self, order: SwapOrder, claim: _Claim) -> tuple[str, ...]:
        """About to cancel for lack of demand (still ``unloading``: this swap has not begun
        the target's load): the target may hold memory all the same (a load left over from
        a controller that lost the store, a Redis that lost its state), so unload it while
        still owning the swap, unless it is at work (returned, not unloaded). If demand
        arrives meanwhile, the load simply runs after all."""
        snap = await self._store.snapshot()
        if snap.phase == Phase.LOADING:
            return ()  # the target's load began (under an earlier owner): it runs to completion
        if not order.target or snap.forced or snap.live_waiters(order.target) > 0:
            return ()
        if busy := await self._at_work(order, claim, (order.target,)):
            return busy
        await self._still_owner(order)
        async with claim.driving():
            await self._driver.unload(order.target, epoch=order.epoch)
        return ()

    async def _fail(self, order: SwapOrder, reason: str, claim: _Claim, tally: _CacheTally) -> None:
        log.error(PoolOutcome.SWAP_FAILED, pool=self._policy.name, target=order.target,
                  epoch=order.epoch, reason=reason)  # fmt: skip
        snap = await self._still_owner(order)
        joined = order.target in snap.residents  # its own commit, beside other loads
        if order.target and not joined and not await self._at_work(order, claim, (order.target,)):
            try:
                async with asyncio.timeout(UNLOAD_AFTER_FAILURE_TIMEOUT_S), claim.driving():
                    await self._driver.unload(order.target, epoch=order.epoch)
            except (TimeoutError, DriverError) as exc:
                log.error("swap_failed_unload_failed", pool=self._policy.name,  # noqa: TRY400
                          target=order.target, error=str(exc))  # fmt: skip
        await self._step(
            lambda s: decide_fail(s, self._policy, order.epoch, self._controller, reason),
            PoolOutcome.SWAP_FAILED,
            tally,
        )

    async def _heartbeat(self, epoch: int, claim: _Claim) -> None:
        interval = self._policy.heartbeat_ttl_ms / 3000
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            lost = False
            asked_at = loop.time()

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
            claim.confirmed(asked_at, self._policy.heartbeat_ttl_ms)

    async def end_lost(self, order: SwapOrder, target: str) -> None:
        """A swap this replica lost while its claim held (:attr:`SwapRan.claim_held`): once
        the pool's state is known again, end it in the audit if the store lost it with
        the state (``decide_lost_swap_end``; docs/adr/0005, point 9). Reads the pool
        every ``LOST_SWAP_POLL_S`` while Redis is unreachable or the state not rebuilt
        yet, for at most ``LOST_SWAP_PATIENCE_S``."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + LOST_SWAP_PATIENCE_S
        while True:
            try:
                snap = await self._store.snapshot()
            except RedisError:
                snap = None
            if snap is not None and snap.phase != Phase.UNKNOWN:
                break
            if loop.time() >= give_up:
                log.error("swap_end_unknown", pool=self._policy.name, swap_id=order.swap_id,
                          epoch=order.epoch, target=target)  # fmt: skip
                return
            await asyncio.sleep(LOST_SWAP_POLL_S)
        decision = decide_lost_swap_end(snap, order, target)
        if decision.audit:
            log.warning("swap_lost_with_state", pool=self._policy.name, swap_id=order.swap_id,
                        epoch=order.epoch, target=target,
                        rebuilt_epoch=snap.rebuilt_epoch)  # fmt: skip
            await self._outcomes.report(decision, None, PoolOutcome.SWAP_CANCELLED)


class Swaps:
    """The swaps this replica owns for one pool, each in its own task that no request can
    cancel; the pool's supervisor is woken when one ends. A swap lost while its claim held
    is followed by a task that ends it in the audit if the store lost it with the pool's
    state (:meth:`SwapRunner.end_lost`)."""

    def __init__(
        self, runner: SwapRunner, announcer: Announcer, pool: str, wake: asyncio.Event
    ) -> None:
        self._runner = runner
        self._announcer = announcer
        self._pool = pool
        self._wake = wake
        self.tasks: set[asyncio.Task[None]] = set()

    def start(self, order: SwapOrder, *, claimed_at: float | None = None) -> None:
        """Run ``order``; ``claimed_at`` as :meth:`SwapRunner.run` takes it."""
        self._start(self._run(order, claimed_at), f"swap-{self._pool}-{order.epoch}")

    def _start(self, work: Coroutine[object, object, None], name: str) -> None:
        """``work`` in a task of its own, that shutdown waits for (a grace at most)."""
        task = asyncio.create_task(work, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, order: SwapOrder, claimed_at: float | None) -> None:
        started = time.monotonic()
        try:
            ran = await self._runner.run(order, claimed_at=claimed_at)
        except asyncio.CancelledError:
            log.info("swap_task_stopped", pool=self._pool, epoch=order.epoch)
            raise
        finally:
            self._wake.set()
        self._announcer.swap_ran(self._pool, ran.target, ran.result, time.monotonic() - started)
        if ran.claim_held:
            # Not another replica's to end: the store lost it, or could not be reached.
            self._start(self._runner.end_lost(order, ran.target), f"swap-end-{order.swap_id}")
