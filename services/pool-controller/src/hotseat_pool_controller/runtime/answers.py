"""The requests one pool answers: a router's acquire, renew, release, cancel and failure
report, and an operator's admin swap and unload."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from hotseat_common.errors import ErrorCode
from hotseat_common.logging import get_logger
from hotseat_common.messages import AcquireRequest, ErrorReply, Granted, PoolView, RenewRequest
from hotseat_pool_controller.decisions.acquire import decide_acquire
from hotseat_pool_controller.decisions.admin import decide_admin_swap, decide_admin_unload
from hotseat_pool_controller.decisions.busy import SlotsRead, all_idle
from hotseat_pool_controller.decisions.preload import Preloads
from hotseat_pool_controller.model import (
    AcquireAsk,
    AddLease,
    AddWaiter,
    Decision,
    Phase,
    PoolPolicy,
    PoolSnapshot,
    Reply,
)
from hotseat_pool_controller.runtime.announcer import Announcer
from hotseat_pool_controller.runtime.arrivals import Arrivals
from hotseat_pool_controller.runtime.recovery import Recovery
from hotseat_pool_controller.runtime.transitions import Transitions
from hotseat_pool_controller.store.pool import PoolStore, Renewal, Renewed
from hotseat_pool_controller.view import pool_view

if TYPE_CHECKING:
    from hotseat_pool_controller.runtime.placement import CopyWriter

log = get_logger(__name__)


class Stir:
    """Wakes a resting supervisor (docs/adr/0011) when something it does not sleep on
    happens here: a sign of life that may move the pool (an acquire that left a waiter or
    changed the state, another replica's state change), or a lease that would outlive
    the rest (a rest no lease was read for may be longer than a lease's life). A grant or
    a renewal costs nothing while the supervisor rests on the pool's leases: each lease
    expires a lease TTL after it, after every lease the supervisor read."""

    def __init__(self, wake: asyncio.Event) -> None:
        self._wake = wake
        self.resting_until: float | None = None
        """While the supervisor rests: when it next reads the pool (``time.monotonic``)."""
        self.stirs = 0
        """Signs of life so far: a supervisor that saw one during its tick does not rest."""
        self.due = math.inf
        """The earliest a lease granted or renewed since the supervisor's last read can
        expire (``time.monotonic``): its rest ends no later."""
        self.copies: frozenset[str] = frozenset()
        """A capacity pool's members that are copies of model groups (docs/adr/0012; a
        one-resident pool counts its leases in the group indexes instead): each one's
        entry says whether it can be loaded here without evicting a busy member, so the
        first lease and the last release of another member wake the supervisor, whose
        tick rewrites the entries."""
        self.serving: bool | None = None
        """Whether the supervisor's last read found the resident serving (``None``: a
        tick is reading it)."""

    def __call__(self) -> None:
        self.stirs += 1
        if self.resting_until is not None:
            self.resting_until = None
            self._wake.set()

    def lease(self, ttl_s: float, member: str) -> None:
        """A lease on ``member`` was granted or renewed here: it expires in ``ttl_s``
        unless renewed."""
        due = time.monotonic() + ttl_s
        self.due = min(self.due, due)
        if self.copies - {member} and self.serving is not True:
            self.serving = True
            self()
        elif self.resting_until is not None and self.resting_until > due:
            self()

    def released(self, member: str, *, last: bool) -> None:
        """A lease on ``member`` ended here; ``last``: its last one."""
        if last and self.copies - {member}:
            self.serving = False
            self()

    def rest(self, until: float | None) -> float | None:
        """The supervisor rests until ``until`` (``None``: it does not rest), or earlier
        when a lease granted during its tick expires sooner; returns when it wakes."""
        if until is not None:
            until = min(until, self.due)
        self.resting_until = until
        return until

    def begin(self) -> int:
        """The supervisor reads the pool: leases granted from now on are read, or stirred."""
        self.due = math.inf
        self.serving = None
        return self.stirs


class PoolAnswers:
    def __init__(
        self,
        store: PoolStore,
        controller: str,
        *,
        transitions: Transitions,
        recovery: Recovery,
        announcer: Announcer,
        wake: asyncio.Event,
        stir: Stir | None = None,
        preloads: Preloads | None = None,
    ) -> None:
        self.policy: PoolPolicy = store.policy
        self._store = store
        self._controller = controller
        self._transitions = transitions
        self._recovery = recovery
        self._announcer = announcer
        self._wake = wake
        """Set when a request may let the pool move: its supervisor ticks at once."""
        self._stir = stir or Stir(wake)
        self._preloads = preloads
        self._arrivals = None if self.policy.has_capacity else Arrivals()
        """A one-resident pool answers acquires for different members in the order they
        came (:mod:`.arrivals`). A capacity pool grants each of its residents in every
        phase, so its mixed traffic is not put in one line."""
        self.copies: CopyWriter | None = None
        """Model groups serve on this one-resident pool: each lease on a member is counted
        in the index of every group whose copy here is another member (docs/adr/0012)."""

    @property
    def name(self) -> str:
        return self.policy.name

    async def view(self) -> PoolView:
        snap = await self._store.snapshot()
        if self._preloads is not None:
            self._preloads.seen(snap)
        return pool_view(self.policy, snap, self._preloads)

    async def _busy(self, member: str, lease_id: str, ttl_ms: int | None) -> None:
        if self.copies is not None:
            await self.copies.busy(self.name, member, lease_id, ttl_ms)

    async def acquire(self, request: AcquireRequest) -> Reply:
        if self._arrivals is None:
            return await self._acquire(request)
        async with self._arrivals.turn(request.member):
            return await self._acquire(request)

    async def _acquire(self, request: AcquireRequest) -> Reply:
        lease_id = uuid.uuid4().hex
        # Counted before it can be granted, so that no group index ever shows a copy
        # placeable here while this lease lives; uncounted when it was not granted.
        await self._busy(request.member, lease_id, self.policy.lease_ttl_ms)
        fast = await self._store.grant_if_resident(
            request.member,
            lease_id,
            request.attempt,
            request.router,
            request_id=request.request_id,
        )
        if fast is not None:
            self._stir.lease(self.policy.lease_ttl_ms / 1000, request.member)  # in the store
            self._announcer.acquired(self.name, request.member, fast.status)
            return fast
        waiting = unknown = False

        def decide(snap: PoolSnapshot, slots_busy: SlotsRead) -> Decision:
            nonlocal waiting, unknown
            waiting, unknown = snap.attempt_waiting, snap.phase == Phase.UNKNOWN
            ask = AcquireAsk.of(request, now_ms=snap.now_ms, lease_id=lease_id)
            return decide_acquire(snap, ask, self.policy, self._controller, slots_busy=slots_busy)

        decision = await self._transitions.decide(decide, request.attempt)
        self._stir.lease(self.policy.lease_ttl_ms / 1000, request.member)
        if unknown or moves_pool(decision, waiting=waiting):
            self._stir()  # the store lost the pool: the supervisor rebuilds it now
        reply = decision.reply or ErrorReply(code=ErrorCode.INTERNAL_ERROR, message="no decision")
        if not isinstance(reply, Granted) or reply.lease_id != lease_id:
            await self._busy(request.member, lease_id, None)  # a re-ask's lease is counted
        self._announcer.acquired(self.name, request.member, reply.status)
        return reply

    async def release(
        self, member: str, lease_id: str, requests: int = 1, longest_s: float | None = None
    ) -> bool:
        released = await self._store.release(member, lease_id, requests, longest_s)
        await self._busy(member, lease_id, None)
        if released.may_move:
            self._wake.set()
        self._stir.released(member, last=released.removed and released.last)
        return released.removed

    async def renew(self, request: RenewRequest) -> Renewed:
        renewed = await self._store.renew(
            request.member,
            request.lease_id,
            epoch=request.epoch,
            attempt=request.attempt,
            request_id=request.request_id,
            router=request.router,
            longest_s=request.longest_s,
        )
        if renewed.outcome is Renewal.UNKNOWN:
            self._stir()  # the store lost the pool: the supervisor rebuilds it now
        else:
            self._stir.lease(self.policy.lease_ttl_ms / 1000, request.member)  # in the store
        if renewed.outcome is Renewal.RENEWED:
            await self._busy(request.member, request.lease_id, self.policy.lease_ttl_ms)
        return renewed

    async def cancel(self, member: str, attempt: str) -> bool:
        removed = await self._store.cancel(member, attempt)
        self._wake.set()
        return removed

    async def report_failure(self, member: str, reason: str) -> None:
        """A router could not reach the member it was granted: check the resident now."""
        log.warning("dispatch_failure_reported", pool=self.name, member=member, reason=reason)
        await self._recovery.check_resident(threshold=1)

    async def admin_swap(self, member: str, *, force: bool = False) -> Decision:
        """``force``: do not consult the members' /slots (their leases still count)."""
        return await self._transitions.decide(
            lambda s, busy: self._forced(
                lambda read: decide_admin_swap(
                    s, member, self._controller, self.policy, slots_busy=read
                ),
                busy,
                force=force,
            )
        )

    async def admin_unload(self, *, force: bool = False) -> Decision:
        return await self._transitions.decide(
            lambda s, busy: self._forced(
                lambda read: decide_admin_unload(s, self._controller, self.policy, slots_busy=read),
                busy,
                force=force,
            )
        )

    def _forced(
        self, decide: Callable[[SlotsRead], Decision], read: SlotsRead, *, force: bool
    ) -> Decision:
        """An operator's action; forced, every member's /slots count as idle, for the
        decision and for the swap it starts."""
        if not force:
            return decide(read)
        decision = decide(all_idle(self.policy))
        if decision.swap is None:
            return decision
        return replace(decision, swap=replace(decision.swap, over_slots=True))


def moves_pool(decision: Decision, *, waiting: bool) -> bool:
    """An acquire's decision changed what a tick decides on: anything but a lease (it
    expires after every lease read before) and a waiter that was waiting already (it
    keeps its place; its deadline only moves later)."""
    return any(
        not isinstance(op, AddLease) and not (isinstance(op, AddWaiter) and waiting)
        for op in decision.ops
    )
