"""The order a one-resident pool's acquires are answered in (``runtime/arrivals.py``):
one waits for those that came before it for another member, never for its own member's,
never for one that came after it, and one that gives up holds nobody back."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from hotseat_pool_controller.runtime.arrivals import Arrivals


class Asking:
    """An acquire in its turn: entered once its turn came, held open until told."""

    def __init__(self, arrivals: Arrivals, member: str) -> None:
        self.entered = asyncio.Event()
        self.answer = asyncio.Event()
        self.task = asyncio.create_task(self._run(arrivals, member))

    async def _run(self, arrivals: Arrivals, member: str) -> None:
        async with arrivals.turn(member):
            self.entered.set()
            await self.answer.wait()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.fixture
def arrivals() -> Arrivals:
    return Arrivals()


async def enters_once_answered(first: Asking, second: Asking) -> None:
    """``first`` is in its turn and ``second`` waits, until ``first`` is answered."""
    await settle()
    assert first.entered.is_set()
    assert not second.entered.is_set()
    first.answer.set()
    await asyncio.wait_for(second.entered.wait(), 5)
    second.answer.set()
    await asyncio.gather(first.task, second.task)


async def test_a_question_waits_for_an_earlier_one_for_another_member(arrivals: Arrivals) -> None:
    other = Asking(arrivals, "coder")
    resident = Asking(arrivals, "judge")
    await enters_once_answered(other, resident)


async def test_questions_for_one_member_never_wait_for_each_other(arrivals: Arrivals) -> None:
    asking = [Asking(arrivals, "judge") for _ in range(5)]
    await settle()
    assert all(a.entered.is_set() for a in asking)
    for a in asking:
        a.answer.set()
    await asyncio.gather(*(a.task for a in asking))


async def test_a_question_never_waits_for_a_later_one(arrivals: Arrivals) -> None:
    first = Asking(arrivals, "judge")
    await settle()
    later = Asking(arrivals, "coder")  # waits for the first, which is not held back by it
    await enters_once_answered(first, later)


async def test_a_question_that_gives_up_holds_nobody_back(arrivals: Arrivals) -> None:
    first = Asking(arrivals, "coder")
    gives_up = Asking(arrivals, "judge")  # waits behind the first
    last = Asking(arrivals, "coder")  # waits behind the one that gives up
    await settle()
    assert not gives_up.entered.is_set()
    assert not last.entered.is_set()
    gives_up.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await gives_up.task
    await asyncio.wait_for(last.entered.wait(), 5)  # the first is still being answered
    assert not first.answer.is_set()
    first.answer.set()
    last.answer.set()
    await asyncio.gather(first.task, last.task)
