"""A one-resident pool's acquires decided in the order they came, across its members.

An acquire for the resident is granted in one round trip (``grant_if_resident``); one for
another member takes the general path (snapshot, decision, write: a few ms), where it
starts a swap if the resident is idle, or becomes a waiter. Issued as they came, the
later question's one-round-trip grant could overtake the earlier question's decision:
the resident was busy by the time that decision read it, and the other member's request
waited for a drain it had come before (docs/adr/0006, "Arrival order"). Here an acquire
waits, before it touches the store, until every acquire that came to this controller
before it for another member of the pool has been answered. Acquires for the same member
never wait for each other, so a resident's steady traffic pays nothing; a controller
cannot order what came to another replica.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class Arrivals:
    """The acquires this controller is answering for one pool, in the order they came."""

    __slots__ = ("_answering", "_next")

    def __init__(self) -> None:
        self._next = 0
        self._answering: dict[int, tuple[str, asyncio.Event]] = {}
        """Acquires not yet answered, by arrival: the member asked for, and set once answered."""

    @contextlib.asynccontextmanager
    async def turn(self, member: str) -> AsyncIterator[None]:
        """Until every acquire that came before this one for another member is answered;
        then this one is answered inside the block."""
        ahead = [answered for m, answered in self._answering.values() if m != member]
        key, answered = self._next, asyncio.Event()
        self._next += 1
        self._answering[key] = (member, answered)
        try:
            for earlier in ahead:
                await earlier.wait()
            yield
        finally:
            del self._answering[key]
            answered.set()
