"""Requests held through a swap wake at its commit with one question per router, not one
each (issue 20): the first grant after the commit is shared by the router's requests
held for that member, under the rules of any sharing (docs/adr/0004), and they leave the
pool's waiters; and they resume one per turn of the event loop, so that the first one's
dispatch is not behind all the others' way to theirs. Real controller, sims, NATS and
Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from hotseat_common.config.model import PoolActivation
from hotseat_common.messages import PoolStateChanged
from hotseat_common.subjects import Subjects
from hotseat_router.activation.nats import NatsActivationClient
from tests.support.stack import Stack, pool_stack_config
from tests.support.waiting import eventually

HELD = 20


async def test_requests_held_through_a_swap_share_the_first_grant_after_it(
    make_stack: Callable[[dict[str, Any]], Stack], nc: NatsClient, prefix: str
) -> None:
    stack = make_stack(pool_stack_config(coder={"loadSeconds": 0.3}))
    stack.start_sims()
    stack.start_controller("c1")
    await stack.wait_resident("judge")
    turn = 0  # the event loop's turns, counted by a task that yields once per turn
    resumed: list[int] = []  # the turn in which each held request got its handle

    async def count_turns() -> None:
        nonlocal turn
        while True:
            await asyncio.sleep(0)
            turn += 1

    counter = asyncio.create_task(count_turns())
    notified: list[PoolStateChanged] = []

    async def record(msg: Msg) -> None:
        notified.append(PoolStateChanged.from_bytes(msg.data))

    await nc.subscribe(Subjects(prefix).pool_events("gpu0"), cb=record)
    async with NatsActivationClient(nc, Subjects(prefix), "r1") as client:

        async def acquire(member: str, name: str, mode: PoolActivation) -> Any:
            lease = await client.acquire(
                pool="gpu0", member=member, mode=mode, attempt=name, request_id=name, budget_s=30
            )
            if mode is PoolActivation.WAIT:
                resumed.append(turn)
            return lease

        incumbent = await acquire("judge", "incumbent", PoolActivation.IF_IDLE)
        held = [
            asyncio.create_task(acquire("coder", f"held-{i}", PoolActivation.WAIT))
            for i in range(HELD)
        ]

        async def all_waiting() -> bool:
            return len(await stack.waiter_deadlines("coder")) == HELD

        await eventually(all_waiting, timeout=15)
        await client.release(incumbent)  # judge drains: the swap to coder starts
        leases = await asyncio.wait_for(asyncio.gather(*held), 30)
        counter.cancel()
        # One per turn: the loop reads and writes between one request's way to its
        # dispatch and the next one's (the request that asked resumes first).
        assert len(set(resumed)) == HELD, resumed
        # Served only on the resident: every handle was granted after the commit.
        state = await stack.pool()
        assert (state["phase"], state["resident"]) == ("idle", "coder")
        # The commit's notification, which woke them, names the state the commit stored
        # (the controller publishes what its commit's script returned, with no read).
        stored = [(state["epoch"], "idle", "coder", state["swapping"], state["closed"])]

        async def commit_announced() -> bool:
            last = [(n.epoch, n.phase, n.resident, n.target, bool(n.closed)) for n in notified]
            return last[-1:] == stored

        await eventually(commit_announced, timeout=10)
        assert len({lease.lease_id for lease in leases}) == 1  # one lease for all twenty
        # Busy is exact: one live lease while they are served, none once the last ends;
        # and none of them is left among the pool's waiters.
        assert list(await stack.lease_expiries("coder")) == [leases[0].lease_id]

        async def no_waiters() -> bool:
            return not await stack.waiter_deadlines("coder")

        await eventually(no_waiters, timeout=10)
        for lease in leases[:-1]:
            await client.release(lease)
        assert list(await stack.lease_expiries("coder")) == [leases[0].lease_id]
        await client.release(leases[-1])

        async def released() -> bool:
            return not await stack.lease_expiries("coder")

        await eventually(released, timeout=10)
