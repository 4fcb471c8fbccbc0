"""The leases one router holds: shared between its requests for the same member, renewed
from one task, and proven valid until a moment on this process's loop clock.

**Sharing.** While this router holds a live lease on a member, another request for that
member shares it instead of asking the controller: the lease already keeps the member
resident and counted busy fleet-wide (no swap can start while it lives), which is all a
fresh grant would prove, so the contract is unchanged; the lease is released when the
last request sharing it ends. Busy stays exact (live leases > 0 exactly while some router
serves the member); the pool's lease count becomes "routers serving", not "requests". A
lease is shared only while its renewals are on schedule, no request on it reported a
dispatch failure (the next request then asks the controller, which checks the resident),
and the controller has not said to stop (a renewal's ``shareable``, or a pool event: the
member fails its health checks, or is closed to new requests by ``maxWait``).

**Renewals** for every held lease come from one background task, not one per lease: most
leases end before their first renewal is due. Each lease is renewed every ttl/3 (sooner as
an unconfirmed lease nears the end of its proof); a refusal, or the proof running out
unconfirmed, sets ``lost`` on every request sharing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from hotseat_common.errors import ErrorCode
from hotseat_common.logging import get_logger
from hotseat_common.messages import RenewReply
from hotseat_router.activation.protocol import Lease

log = get_logger(__name__)

Renew = Callable[[Lease, float | None], Awaitable[RenewReply | None]]
"""Ask the controller to renew a lease, telling it the longest request that ended on the
lease since the last renewal (``None``: none); ``None`` when it could not be asked."""


@dataclass
class _Held:
    """A lease this router holds: the requests using it (one :class:`Lease` handle each,
    all sharing ``lost``), its proof of validity, and when it is next renewed."""

    lease: Lease
    due: float
    handles: list[Lease]
    renewing: bool = False
    shareable: bool = True
    served: int = 1
    """How many requests used the lease (the one it was granted for, and each share)."""
    since: list[float] = field(default_factory=list)
    """When each request in ``handles`` began using the lease (loop clock), in order."""
    longest_s: float = 0.0
    """The longest any request that ended ran on the lease (seconds)."""
    unreported_s: float = 0.0
    """The longest request that ended since the last renewal was sent (seconds; 0: none)."""

    @property
    def key(self) -> tuple[str, str]:
        return self.lease.pool, self.lease.member

    def prove(self, valid_until: float) -> None:
        self.lease.valid_until = valid_until
        for handle in self.handles:
            handle.valid_until = valid_until

    def add(self, handle: Lease, now: float) -> None:
        self.handles.append(handle)
        self.since.append(now)

    def drop(self, handle: Lease, now: float) -> bool:
        """Forget one request's handle (and how long it ran); False if it was already
        gone (released twice)."""
        for i, held in enumerate(self.handles):
            if held is handle:
                self.longest_s = max(self.longest_s, now - self.since[i])
                self.unreported_s = max(self.unreported_s, now - self.since[i])
                del self.handles[i]
                del self.since[i]
                return True
        return False


class Dropped(NamedTuple):
    """A lease its last request let go of: to release at the controller (``requests``
    > 0), with the number of requests that used it and the longest any of them ran (the
    member's measured request time, docs/adr/0006)."""

    requests: int
    longest_s: float


class HeldLeases:
    def __init__(self, renew: Renew) -> None:
        self._renew_one = renew
        self._held: dict[str, _Held] = {}
        self._shared: dict[tuple[str, str], _Held] = {}
        self._renewer: asyncio.Task[None] | None = None
        self._renewer_wake = asyncio.Event()
        self._next_renewal = math.inf
        self._tasks: set[asyncio.Task[None]] = set()

    async def stop(self) -> set[asyncio.Task[None]]:
        """Stop renewing; returns the renewals still on their way (for the caller to let
        finish)."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        return set(self._tasks)

    def share(self, pool: str, member: str, *, waited: bool = False) -> Lease | None:
        """A handle on a live lease this router already holds on ``member``, if any.
        ``waited``: the request was held for the member and shares the lease granted after
        the swap it waited for (its handle names that swap, as the grant does)."""
        held = self._shared.get((pool, member))
        if held is None:
            return None
        lease = held.lease
        left = lease.valid_until - asyncio.get_running_loop().time()
        if lease.lost.is_set() or not held.shareable or left < lease.ttl_s / 2:
            return None  # renewals behind schedule or the member in doubt: ask
        # Its own handle (``lost`` is the same event).
        handle = lease.handle(swap_id=lease.swap_id if waited else None)
        held.add(handle, asyncio.get_running_loop().time())
        held.served += 1
        return handle

    def hold(self, lease: Lease) -> Lease:
        """A lease just granted: shared from now on, and renewed until released."""
        loop = asyncio.get_running_loop()
        due = _next_renewal(lease, loop.time())
        held = _Held(lease, due, handles=[lease], since=[loop.time()])
        self._held[lease.lease_id] = held
        if lease.group is not None:
            # A group's lease counts one request: its placements spread by those counts.
            held.shareable = False
        current = self._shared.get(held.key)
        if held.shareable and (
            current is None or not current.shareable or current.lease.lost.is_set()
        ):
            self._shared[held.key] = held
        if self._renewer is None:
            self._renewer = loop.create_task(self._renew_loop())
        if due < self._next_renewal:
            self._renewer_wake.set()
        return lease

    def drop(self, lease: Lease) -> Dropped:
        """One request is done with its handle: when it was the last one (the lease is
        forgotten here and must be released at the controller), how many requests used
        the lease and the longest any of them ran; 0 requests otherwise, and for a handle
        released twice."""
        held = self._held.get(lease.lease_id)
        now = asyncio.get_running_loop().time()
        if held is None or not held.drop(lease, now) or held.handles:
            return Dropped(0, 0.0)
        self._held.pop(lease.lease_id, None)
        if self._shared.get(held.key) is held:
            del self._shared[held.key]
        return Dropped(held.served, held.longest_s)

    def unshare(self, lease: Lease) -> None:
        """The requests on this lease go on; new ones ask the controller."""
        held = self._held.get(lease.lease_id)
        if held is not None:
            self._unshare(held)

    def unshare_member(self, pool: str, member: str) -> None:
        """Stop sharing this router's lease on ``member``: the requests on it go on, new
        ones ask the controller (the member was closed to new requests)."""
        held = self._shared.get((pool, member))
        if held is not None:
            self._unshare(held)

    def _unshare(self, held: _Held) -> None:
        held.shareable = False
        if self._shared.get(held.key) is held:
            del self._shared[held.key]

    async def _renew_loop(self) -> None:
        """Renew each held lease every ttl/3 and move its ``valid_until`` on each confirmed
        renewal. A refusal, or ``valid_until`` passing unconfirmed (the controller or its
        store unreachable for a whole TTL, or this loop stalled), means the lease may be
        gone: set ``lost``."""
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            for held in list(self._held.values()):
                if held.renewing or held.due > now or held.lease.lost.is_set():
                    continue
                if now >= held.lease.valid_until:
                    self._lose(held)
                    continue
                held.renewing = True
                task = loop.create_task(self._renew(held))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            waiting = [
                h.due for h in self._held.values() if not h.renewing and not h.lease.lost.is_set()
            ]
            self._next_renewal = min(waiting, default=math.inf)
            self._renewer_wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(self._next_renewal if waiting else None):
                    await self._renewer_wake.wait()

    async def _renew(self, held: _Held) -> None:
        lease = held.lease
        loop = asyncio.get_running_loop()
        asked_at = loop.time()
        ended, held.unreported_s = held.unreported_s or None, 0.0
        try:
            reply = await self._renew_one(lease, ended)
        finally:
            held.renewing = False
        if self._held.get(lease.lease_id) is not held or lease.lost.is_set():
            return  # released or lost meanwhile
        if reply is not None and reply.ok:
            held.prove(asked_at + reply.ttl_s)
            if not reply.shareable:
                # The member fails its health checks or is closed to new requests: the
                # requests on this lease go on, new ones ask the controller (which holds
                # or skips them).
                self._unshare(held)
        elif reply is not None and reply.code is None:
            self._lose(held)
            return
        held.due = _next_renewal(lease, loop.time())
        if held.due < self._next_renewal:
            self._renewer_wake.set()

    def _lose(self, held: _Held) -> None:
        """Renewing stops; the requests on it end, and the last one still releases it."""
        lease = held.lease
        if self._shared.get(held.key) is held:
            del self._shared[held.key]
        log.error(ErrorCode.LEASE_LOST, pool=lease.pool, member=lease.member, lease=lease.lease_id)
        lease.lost.set()  # every request sharing it sees it


def _next_renewal(lease: Lease, now: float) -> float:
    """Every ttl/3, sooner as ``valid_until`` nears while renewals go unconfirmed."""
    return now + max(0.05, min(lease.ttl_s / 3, (lease.valid_until - now) / 2))
