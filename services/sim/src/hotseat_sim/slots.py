"""llama.cpp-style slots: at most ``n`` generations at once, the rest wait in arrival order."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any


@dataclass
class Slot:
    id: int
    task: int = -1
    processing: bool = False
    n_decoded: int = 0
    n_remain: int = 0

    def as_json(self) -> dict[str, Any]:
        """The fields of one entry of llama.cpp's ``GET /slots``."""
        return {
            "id": self.id,
            "id_task": self.task,
            "is_processing": self.processing,
            "next_token": {
                "has_next_token": self.processing and self.n_remain > 0,
                "n_remain": self.n_remain if self.processing else -1,
                "n_decoded": self.n_decoded,
            },
        }


class SlotPool:
    """A fair (FIFO) pool of slots; a waiter that is cancelled leaves the queue."""

    def __init__(self, n: int) -> None:
        self.slots = [Slot(i) for i in range(n)]
        self._free: deque[Slot] = deque(self.slots)
        self._waiters: deque[asyncio.Future[Slot]] = deque()
        self._tasks = 0

    @property
    def queued(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    async def acquire(self, n_tokens: int) -> Slot:
        """A slot marked processing, waiting behind earlier callers when all are busy.

        The caller owns the slot until it calls :meth:`release` with it, exactly once.
        """
        if self._free and not self._waiters:
            slot = self._free.popleft()
            self._take(slot)
        else:
            waiter: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                slot = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self.release(waiter.result())  # granted as we were cancelled: pass it on
                else:
                    self._waiters.remove(waiter)
                raise
        slot.n_decoded = 0
        slot.n_remain = n_tokens
        return slot

    def _take(self, slot: Slot) -> None:
        self._tasks += 1
        slot.task = self._tasks
        slot.processing = True
        slot.n_decoded = 0
        slot.n_remain = 0

    def release(self, slot: Slot) -> None:
        """Free ``slot`` and hand it to the longest waiter, if any."""
        slot.processing = False
        slot.n_remain = 0
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._take(slot)  # the waiter owns it from now on
                waiter.set_result(slot)
                return
        self._free.append(slot)

    def as_json(self) -> list[dict[str, Any]]:
        return [slot.as_json() for slot in self.slots]
