"""A scripted :class:`ActivationClient` (our own interface, so a test double is fair)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hotseat_common.config.model import PoolActivation
from hotseat_router.activation.protocol import Lease, OnWait


@dataclass
class Acquire:
    pool: str
    member: str
    mode: PoolActivation
    attempt: str
    request_id: str
    budget_s: float
    priority: int = 0


@dataclass
class FakeActivation:
    """Per member: grant at once, raise a scripted error, or hold until ``release_hold``."""

    errors: dict[str, Exception] = field(default_factory=dict)
    hold: dict[str, asyncio.Event] = field(default_factory=dict)
    acquires: list[Acquire] = field(default_factory=list)
    granted: list[Lease] = field(default_factory=list)
    released: list[Lease] = field(default_factory=list)
    reported: list[tuple[str, str]] = field(default_factory=list)
    released_event: asyncio.Event = field(default_factory=asyncio.Event)
    asked: asyncio.Event = field(default_factory=asyncio.Event)

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
        self.acquires.append(Acquire(pool, member, mode, attempt, request_id, budget_s, priority))
        self.asked.set()
        if member in self.hold:
            await self.hold[member].wait()
        if member in self.errors:
            raise self.errors[member]
        lease = Lease(pool=pool, member=member, lease_id=f"l{len(self.granted)}", epoch=1, ttl_s=15)
        self.granted.append(lease)
        return lease

    async def release(self, lease: Lease, *, confirm: bool = False) -> None:
        self.released.append(lease)
        self.released_event.set()

    async def report_failure(self, lease: Lease, *, request_id: str, reason: str) -> None:
        self.reported.append((lease.member, reason))

    def factory(self, *_args: object) -> FakeActivation:
        return self
