"""Waiters released together resume one per turn of the event loop, in the order they
came, and none is lost when one leaves (``hotseat_router.activation.turns``). The loop's
turns are counted by a task that yields once per turn: no clock is read."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from hotseat_router.activation.turns import Turns

WAITERS = 5


class Loop:
    """The number of turns the event loop has taken since the count began."""

    def __init__(self) -> None:
        self.turn = 0

    async def count(self) -> None:
        while True:
            await asyncio.sleep(0)
            self.turn += 1


@pytest.fixture
async def loop_turns() -> AsyncIterator[Loop]:
    loop = Loop()
    counter = asyncio.create_task(loop.count())
    yield loop
    counter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await counter


async def turns_pass(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_waiters_resume_in_order_one_per_turn(loop_turns: Loop) -> None:
    turns = Turns()
    resumed: list[tuple[int, int]] = []

    async def waiter(i: int) -> None:
        await turns.wait()
        resumed.append((i, loop_turns.turn))

    tasks = [asyncio.create_task(waiter(i)) for i in range(WAITERS)]
    await turns_pass(2)  # every waiter is waiting
    assert resumed == []
    turns.open()
    await asyncio.gather(*tasks)
    assert [i for i, _ in resumed] == list(range(WAITERS))
    assert len({turn for _, turn in resumed}) == WAITERS


async def test_a_waiter_that_leaves_before_its_turn_is_skipped() -> None:
    turns = Turns()
    tasks = [asyncio.create_task(turns.wait()) for _ in range(WAITERS)]
    await turns_pass(2)
    tasks[1].cancel()
    turns.open()
    # Each waiter takes at most two turns (its wake-up and the next one's hand-over).
    await turns_pass(2 * WAITERS + 2)
    assert tasks[1].cancelled()
    assert all(t.done() and not t.cancelled() for t in tasks[:1] + tasks[2:])


async def test_a_waiter_that_leaves_when_its_turn_came_passes_it_on() -> None:
    turns = Turns()
    tasks = [asyncio.create_task(turns.wait()) for _ in range(WAITERS)]
    await turns_pass(2)
    turns.open()
    await asyncio.sleep(0)  # the first waiter's turn is given; it has not resumed yet
    tasks[0].cancel()
    await turns_pass(2 * WAITERS + 2)
    assert tasks[0].cancelled()
    assert all(t.done() and not t.cancelled() for t in tasks[1:])


async def test_a_waiter_that_comes_after_everyone_resumed_resumes() -> None:
    turns = Turns()
    first = asyncio.create_task(turns.wait())
    await asyncio.sleep(0)
    turns.open()
    await first
    await turns_pass(2)  # the hand-over found nobody: the chain ended
    late = asyncio.create_task(turns.wait())
    await turns_pass(4)
    assert late.done()
    assert not late.cancelled()
