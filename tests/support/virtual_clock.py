"""A virtual clock for tests that must replay exactly (hypothesis state machines): one
count of milliseconds that passes only when the test says so, read by the store's
scripts (a :class:`RedisLink` given ``clock``) and by an event loop whose timers
(``asyncio.sleep``, ``asyncio.timeout``) fall due on it. I/O stays real: Redis is real,
only "now" is the test's."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from typing import Any

START_MS = 1_700_000_000_000
"""Where virtual time starts: a plausible Redis ``TIME``, the same at every run."""


class VirtualClock:
    def __init__(self, start_ms: int = START_MS) -> None:
        self.ms = start_ms

    def __call__(self) -> int:
        return self.ms


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on a :class:`VirtualClock`: a timer falls due only once the clock
    has reached it. It remembers the futures its timers resolve (``asyncio.sleep``), so a
    test can tell a task that waits for time from one that waits for I/O."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self.clock = clock
        self._timed: weakref.WeakSet[asyncio.Future[Any]] = weakref.WeakSet()

    def time(self) -> float:
        return self.clock.ms / 1000

    def call_at(  # type: ignore[override]
        self, when: float, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> asyncio.TimerHandle:
        if args and isinstance(args[0], asyncio.Future):
            self._timed.add(args[0])
        return super().call_at(when, callback, *args, context=context)

    def waits_for_time(self, future: asyncio.Future[Any]) -> bool:
        return future in self._timed


def parked(task: asyncio.Future[Any], loop: VirtualLoop, gates: set[int]) -> bool:
    """True when ``task`` can only move once the test acts: it waits on one of ``gates``
    (futures the test resolves) or on the clock, itself or through a gather whose every
    unfinished child does. (CPython's task records what it awaits in ``_fut_waiter``; a
    task waiting on a socket, or ready to run, is not parked.)"""
    waiting = getattr(task, "_fut_waiter", None)
    if waiting is None or waiting.done():
        return False
    if id(waiting) in gates or loop.waits_for_time(waiting):
        return True
    children = getattr(waiting, "_children", None)
    if children is None:
        return False
    unfinished = [c for c in children if not c.done()]
    return bool(unfinished) and all(parked(c, loop, gates) for c in unfinished)


async def until_parked(
    loop: VirtualLoop, gates: Callable[[], set[int]], *, budget_s: float = 120.0
) -> None:
    """Let every other task of ``loop`` run until each is done or :func:`parked`. There
    is no event for "every task waits on the test": the loop is turned (a zero sleep,
    which also lets replies from Redis in) until it is so, within a real-time budget
    that only a hung Redis or a task spinning for ever would use up."""
    me = asyncio.current_task()
    deadline = time.monotonic() + budget_s
    while True:
        await asyncio.sleep(0)  # one turn of the loop (timers due now run too)
        others = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        if all(parked(t, loop, gates()) for t in others):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"tasks neither ended nor parked: {others}")
