"""Many waiters released by one event, resumed one per turn of the event loop.

The answer to the question a router's requests for a member share (ADR 0004, "one
question at a time per member") releases every request that followed it at once. Woken
together, each would run its whole way to its own upstream request before the loop reads
or writes anything: the first one's request body (which the HTTP client writes from a
task of its own) and its new connection would wait for all the others' way there, which
grows with the number held. Resumed one per turn, in the order they came, the loop does
its reads and writes between them, so the first dispatch goes out first. The work is the
same; the last one resumes after the first ones' reads and writes instead of before them.
"""

from __future__ import annotations

import asyncio
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
