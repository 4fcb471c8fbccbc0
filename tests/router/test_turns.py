"""Waiters released together resume in the order ``hotseat_router.activation.turns``
promises, and none is lost when one leaves: a question's followers one per turn of the
event loop, in the order they came; a state change's waiters the first alone, the others
together a turn later. The loop's turns are counted by a task that yields once per turn:
no clock is read."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from hotseat_router.activation.turns import FirstThenRest, Turns

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


async def resumed(
    loop_turns: Loop, wait: Callable[[], Awaitable[None]], release: Callable[[], None]
) -> list[tuple[int, int]]:
    """``WAITERS`` waiters, released once all wait: each one's index and the turn it
    resumed in, in the order they resumed."""
    order: list[tuple[int, int]] = []

    async def waiter(i: int) -> None:
        await wait()
        order.append((i, loop_turns.turn))

    tasks = [asyncio.create_task(waiter(i)) for i in range(WAITERS)]
    await turns_pass(2)  # every waiter is waiting
    assert order == []
    release()
    await asyncio.gather(*tasks)
    return order


async def test_waiters_resume_in_order_one_per_turn(loop_turns: Loop) -> None:
    turns = Turns()
    order = await resumed(loop_turns, turns.wait, turns.open)
    assert [i for i, _ in order] == list(range(WAITERS))
    assert len({turn for _, turn in order}) == WAITERS


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


async def test_a_change_wakes_its_first_waiter_alone_and_the_others_a_turn_later(
    loop_turns: Loop,
) -> None:
    change = FirstThenRest()
    order = await resumed(loop_turns, change.wait, change.set)
    assert [i for i, _ in order] == list(range(WAITERS))
    first, *rest = [turn for _, turn in order]
    assert set(rest) == {first + 1}, order


async def test_a_change_skips_a_first_waiter_that_left() -> None:
    change = FirstThenRest()
    tasks = [asyncio.create_task(change.wait()) for _ in range(WAITERS)]
    await turns_pass(2)
    tasks[0].cancel()
    await asyncio.sleep(0)  # the cancelled waiter has left
    change.set()
    await asyncio.sleep(0)  # the first still waiting resumes alone
    assert tasks[1].done()
    assert not tasks[1].cancelled()
    assert not any(t.done() for t in tasks[2:])
    await turns_pass(2)
    assert tasks[0].cancelled()
    assert all(t.done() and not t.cancelled() for t in tasks[1:])


async def test_a_waiter_that_comes_after_the_change_resumes_at_once() -> None:
    change = FirstThenRest()
    change.set()
    await asyncio.wait_for(change.wait(), timeout=5)
    assert change.happened
