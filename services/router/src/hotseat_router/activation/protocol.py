"""The router's side of the activation contract: how a request gets a lease on a pool member.

The router calls :meth:`ActivationClient.acquire` before dispatching to a pooled backend.
It either returns a :class:`Lease` (the member is resident and counted busy until the lease
is released) or raises one of :mod:`hotseat_common.errors`:

- ``IncumbentBusy``      IfIdle and the incumbent serves: skip this backend (``busy_skip``).
- ``QueueFull``          the pool's maxWaiters is reached: skip this backend.
- ``ActivationTimeout``  the pool's swapBudget elapsed while held: answer 503 at once.
- ``SwapFailed``         the load failed: treat like a failed backend, try the next.
- ``UnknownPool`` / ``ControllerUnavailable``: the pool cannot vouch for the member.

The lease must be released when the response body ends (streaming included) or the client
leaves, from the stream generator's ``finally``; while held, it is renewed in the
background, and ``lease.lost`` is set when a renewal is refused (the stream must then end).

``lease.valid_until`` is the router's own proof of the lease: the local time, on the
event loop's clock, before which the controller cannot have let it expire (the moment the
acquire or the last confirmed renewal was *sent*, plus the TTL the controller then gave).
A router whose loop stalled or whose process was frozen past it no longer holds the
lease, whatever it has not yet heard: it must not dispatch on it or keep streaming.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from hotseat_common.config.model import PoolActivation
from hotseat_common.messages import PlacementReason, WaitReply

OnWait = Callable[[WaitReply], None]
"""Told each wait answer of an acquire (position, estimate, target)."""


def new_attempt(router: str) -> str:
    """A fresh id for one try of one backend by this router: the key of its waiter and its
    lease at the controller (never anything a client sent, so no client can make two
    requests share a lease)."""
    return f"{router}-{os.urandom(9).hex()}"


class LeaseLoss:
    """Set once, when the controller refused a lease's renewal. Every request sharing the
    lease is told through the callback it registered (:meth:`watch`), so a streaming
    request needs no task of its own to notice; it can be awaited too."""

    __slots__ = ("_callbacks", "_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._callbacks: dict[Callable[[], None], None] = {}
        """In the order they came (a dict: a request's ``unwatch`` takes no scan)."""
        self._waiters: set[asyncio.Future[None]] = set()

    def is_set(self) -> bool:
        return self._set

    @property
    def watching(self) -> int:
        """How many requests watch it now (each stops watching as it ends)."""
        return len(self._callbacks)

    @property
    def waiting(self) -> int:
        """How many :meth:`wait` calls are waiting now (one that gave up is not)."""
        return len(self._waiters)

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        callbacks, self._callbacks = self._callbacks, {}
        waiters, self._waiters = self._waiters, set()
        for callback in callbacks:
            callback()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def watch(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the lease is lost (at once if it already is)."""
        if self._set:
            callback()
        else:
            self._callbacks[callback] = None

    def unwatch(self, callback: Callable[[], None]) -> None:
        self._callbacks.pop(callback, None)

    async def wait(self) -> None:
        if not self._set:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.add(waiter)
            try:
                await waiter
            finally:  # a waiter that gave up leaves nothing behind
                self._waiters.discard(waiter)


@dataclass
class Lease:
    """A granted activation lease on ``pool``/``member``."""

    pool: str
    member: str
    lease_id: str
    epoch: int
    ttl_s: float
    attempt: str = ""
    """The attempt that was granted the lease."""
    request_id: str = ""
    """The client's request id of that attempt (audit only)."""
    swap_id: str | None = None
    """The swap this attempt waited for that made the member resident (audit only);
    ``None`` on a lease shared with another request."""
    lost: LeaseLoss = field(default_factory=LeaseLoss)
    """Set when the controller refused a renewal: the member may no longer be resident."""
    valid_until: float = math.inf
    """Event-loop time until which the lease is certainly alive (``inf``: no controller)."""
    group: str | None = None
    """The model group that placed it (docs/adr/0012): never shared, and its renewals and
    release name the group."""

    def handle(self, *, swap_id: str | None) -> Lease:
        """Another request's handle on this lease: the same lease (``lost`` is the same
        object) naming ``swap_id``. Built field by field rather than with
        ``dataclasses.replace``, which costs several times as much on every shared
        request; tests/router/test_units.py holds the two to the same result."""
        return Lease(
            self.pool,
            self.member,
            self.lease_id,
            self.epoch,
            self.ttl_s,
            self.attempt,
            self.request_id,
            swap_id,
            self.lost,
            self.valid_until,
            self.group,
        )

    def expired(self) -> bool:
        """True once the lease may have expired at the controller (or was refused)."""
        return self.lost.is_set() or asyncio.get_running_loop().time() >= self.valid_until


@dataclass(frozen=True, slots=True)
class GroupAsk:
    """One request's question to a model group."""

    group: str
    mode: PoolActivation
    attempt: str
    request_id: str
    budget_s: float
    priority: int = 0
    session: str | None = None
    """The conversation: placed where its last turn was served when that costs no wait."""
    avoid: tuple[str, ...] = ()
    """Pools not to place it on (this router quarantined their member's backend)."""


@dataclass(frozen=True, slots=True)
class Placed:
    """A model group's request, leased on the pool the controller placed it on."""

    lease: Lease
    backend: str
    """The backend that fronts the placed member."""
    reason: PlacementReason


class ActivationClient(Protocol):
    async def acquire(
        self,
        *,
        pool: str,
        member: str,
        mode: PoolActivation,
        attempt: str,
        request_id: str,
        budget_s: float,
        priority: int = 0,
        on_wait: OnWait | None = None,
    ) -> Lease:
        """Hold until ``member`` is resident and leased, for at most ``budget_s`` seconds.

        ``attempt`` (from :func:`new_attempt`) names this try at the controller;
        ``request_id`` is the client's, for audit; ``priority`` ranks it among the pool's
        waiters; ``on_wait`` hears each answer that says to wait (its place in line and
        estimate). Cancelling the awaiting task (client disconnect) withdraws the attempt
        from the pool's waiters.
        """
        ...

    async def place(self, ask: GroupAsk, on_wait: OnWait | None = None) -> Placed:
        """Like :meth:`acquire`, for a model group: the controller picks the pool
        (docs/adr/0012) and the request holds there."""
        ...

    async def release(self, lease: Lease, *, confirm: bool = False) -> None:
        """Give the lease back (idempotent, never raises). ``confirm``: return only once the
        controller has it (or could not be reached), so that a next acquire of the same
        request never finds its own lease still there."""
        ...

    async def report_failure(self, lease: Lease, *, request_id: str, reason: str) -> None:
        """Tell the controller that a granted member failed at the connection level."""
        ...
