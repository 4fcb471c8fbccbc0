"""llama.cpp-style slots: at most ``n`` generations at once, the rest wait in arrival order.

Each slot keeps a prompt cache like llama.cpp's: the tokens of its last prompt and reply.
A request takes the free slot whose cache shares the longest prefix with its prompt (when
that covers more than a tenth of the prompt, as llama.cpp's ``--slot-prompt-similarity``
default), else the free slot used least recently. A cache belongs to one load of the
model (``generation``): after an unload every slot starts empty, as a new process would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

SIMILARITY = 0.1
"""A cache is chosen only when its common prefix covers more than this share of a prompt."""


def common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Slot:
    id: int
    task: int = -1
    processing: bool = False
    n_decoded: int = 0
    n_remain: int = 0
    cache: list[str] = field(default_factory=list)
    """The tokens this slot holds: its last prompt, then its reply as it is generated."""
    generation: int = 0
    """The model load the cache belongs to."""

    def cached(self, generation: int) -> list[str]:
        """The cache, if it belongs to the model as loaded now (else nothing)."""
        if self.generation != generation:
            self.cache = []
            self.generation = generation
        return self.cache

    def as_json(self, generation: int) -> dict[str, Any]:
        """The fields of one entry of llama.cpp's ``GET /slots``."""
        out: dict[str, Any] = {
            "id": self.id,
            "id_task": self.task,
            "is_processing": self.processing,
            "next_token": {
                "has_next_token": self.processing and self.n_remain > 0,
                "n_remain": self.n_remain if self.processing else -1,
                "n_decoded": self.n_decoded,
            },
        }
        if cached := self.cached(generation):
            out["n_prompt_tokens"] = len(cached)
        return out


class SlotPool:
    """A fair (FIFO) pool of slots; a waiter that is cancelled leaves the queue."""

    def __init__(self, n: int) -> None:
        self.slots = [Slot(i) for i in range(n)]
        self._free: deque[Slot] = deque(self.slots)
        self._waiters: deque[asyncio.Future[Slot]] = deque()
        self._reserved: dict[int, deque[asyncio.Future[Slot]]] = {}
        self._tasks = 0

    @property
    def queued(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    def _choose(self, prompt: Sequence[str], generation: int) -> Slot:
        """The free slot for ``prompt``: the best cache, else the least recently used."""
        best, best_len = self._free[0], 0
        for slot in self._free:
            shared = common_prefix(slot.cached(generation), prompt)
            if shared > best_len and shared > SIMILARITY * len(prompt):
                best, best_len = slot, shared
        self._free.remove(best)
        return best

    async def acquire(self, n_tokens: int, prompt: Sequence[str] = (), generation: int = 0) -> Slot:
        """A slot marked processing, waiting behind earlier callers when all are busy.

        The caller owns the slot until it calls :meth:`release` with it, exactly once.
        """
        if self._free and not self._waiters:
            slot = self._choose(prompt, generation)
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
        """Free ``slot``: to a save or restore waiting for it, else the longest waiter."""
        slot.processing = False
        slot.n_remain = 0
        reserved = self._reserved.get(slot.id)
        while reserved:
            waiter = reserved.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._take(slot)  # the waiter owns it from now on
                waiter.set_result(slot)
                return
        self._free.append(slot)

    @contextlib.asynccontextmanager
    async def reserved(self, slot_id: int) -> AsyncIterator[Slot]:
        """Slot ``slot_id`` held out of use (a save or restore of its cache), waiting until
        the request in it ends, as llama.cpp defers such a task; released on exit."""
        slot = self.slots[slot_id]
        if slot in self._free:
            self._free.remove(slot)
        else:
            waiter: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
            self._reserved.setdefault(slot_id, deque()).append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self.release(slot)
                raise
        try:
            yield slot
        finally:
            self.release(slot)

    def as_json(self, generation: int = 0) -> list[dict[str, Any]]:
        return [slot.as_json(generation) for slot in self.slots]
