"""Many waiters released by one event: in what order they resume.

:class:`Turns`, for the requests that followed one question:

The answer to the question a router's requests for a member share (ADR 0004, "one
question at a time per member") releases every request that followed it at once. Woken
together, each would run its whole way to its own upstream request before the loop reads
or writes anything: the first one's request body (which the HTTP client writes from a
task of its own) and its new connection would wait for all the others' way there, which
grows with the number held. Resumed one per turn, in the order they came, the loop does
its reads and writes between them, so the first dispatch goes out first. The work is the
same; the last one resumes after the first ones' reads and writes instead of before them.

:class:`FirstThenRest`, for the requests waiting for a pool's state change: the first
resumes alone and asks the question; the others resume together on the next turn, when
its question is already queued for the wire ahead of them, and all find it and follow
it. Woken together, the question left only after every one of them had run (the NATS
client writes from a task of its own). Woken one per turn, those woken after its answer
landed would each ask again, for a lease of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque


class Turns:
    """Waiters resumed in the order they came, one per turn of the loop, once opened."""

    __slots__ = ("_idle", "_waiting", "opened")

    def __init__(self) -> None:
        self.opened = False
        self._idle = False
        """Opened, and every waiter so far has had its turn: a newcomer starts the chain."""
        self._waiting: deque[asyncio.Future[None]] = deque()

    def open(self) -> None:
        """Release the waiters, the first on the loop's next turn."""
        if not self.opened:
            self.opened = True
            asyncio.get_running_loop().call_soon(self._next)

    async def wait(self) -> None:
        """Until opened and this waiter's turn has come. A waiter cancelled before its turn
        is skipped; one cancelled after it passes it on, as one that resumed does."""
        loop = asyncio.get_running_loop()
        turn = loop.create_future()
        self._waiting.append(turn)
        if self._idle:
            self._idle = False
            loop.call_soon(self._next)
        try:
            await turn
        finally:
            if turn.done() and not turn.cancelled():
                loop.call_soon(self._next)

    def _next(self) -> None:
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._idle = True


class FirstThenRest:
    """Waiters of one event: once it happened, the first still waiting resumes on the
    loop's next turn, all the others together on the turn after. A waiter that comes
    after the event resumes at once."""

    __slots__ = ("_waiting", "happened")

    def __init__(self) -> None:
        self.happened = False
        self._waiting: deque[asyncio.Future[None]] = deque()

    async def wait(self) -> None:
        """Until the event happened and this waiter's turn has come."""
        if self.happened:
            return
        woken = asyncio.get_running_loop().create_future()
        self._waiting.append(woken)
        try:
            await woken
        finally:
            if woken.cancelled():  # a waiter that gave up leaves no trace behind
                with contextlib.suppress(ValueError):
                    self._waiting.remove(woken)

    def set(self) -> None:
        """The event happened: release the waiters, the first one alone."""
        if self.happened:
            return
        self.happened = True
        waiting, self._waiting = self._waiting, deque()
        while waiting:
            first = waiting.popleft()
            if not first.done():
                first.set_result(None)
                break
        if waiting:
            asyncio.get_running_loop().call_soon(_release, waiting)


def _release(waiting: deque[asyncio.Future[None]]) -> None:
    for woken in waiting:
        if not woken.done():
            woken.set_result(None)
