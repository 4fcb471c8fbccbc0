"""A one-resident pool decides its acquires in the order they came, across members
(docs/adr/0006, "Arrival order"): a question for the idle resident that came right behind
one for another member is not granted ahead of that member's decision, which starts the
swap. Real controller, sims, NATS and Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NatsClient

from hotseat_common.config.model import PoolActivation
from hotseat_common.messages import ACQUIRE_REPLY, AcquireRequest, WaitReply
from hotseat_common.subjects import Subjects
from tests.support.stack import Stack, pool_stack_config


def _ask(member: str, attempt: str) -> bytes:
    question = AcquireRequest(
        pool="gpu0",
        member=member,
        mode=PoolActivation.WAIT,
        attempt=attempt,
        request_id=attempt,
        router="r1",
        hold_s=30,
    )
    return question.to_bytes()


async def test_a_question_for_the_resident_waits_for_an_earlier_one_for_another_member(
    make_stack: Callable[[dict[str, Any]], Stack], nc: NatsClient, prefix: str
) -> None:
    stack = make_stack(pool_stack_config())
    stack.start_sims()
    stack.start_controller("c1")
    await stack.wait_resident("judge")  # idle: no lease, no waiter
    acquire = Subjects(prefix).acquire
    # Both questions leave in one write of this connection, so the controller reads them
    # together: coder's first (its decision takes a snapshot and a write), then judge's
    # (the resident's one-round-trip grant, which used to be answered first).
    first, second = await asyncio.gather(
        nc.request(acquire, _ask("coder", "first"), timeout=10),
        nc.request(acquire, _ask("judge", "second"), timeout=10),
    )
    other = ACQUIRE_REPLY.validate_json(first.data)
    resident = ACQUIRE_REPLY.validate_json(second.data)
    # coder's question found judge idle and started the swap to coder; judge's, decided
    # after it, waits through that swap instead of making judge busy ahead of it.
    assert isinstance(other, WaitReply), other
    assert other.target == "coder", other
    assert isinstance(resident, WaitReply), resident
    assert resident.target == "coder", resident
    assert not await stack.lease_expiries("judge")
