"""A lease is only as good as the router can prove: a grant that arrives after its lease
may have expired is not used, a retried acquire is told the time its lease has left, and
a lease whose renewals go unconfirmed for a whole TTL is given up (docs/reliability.md,
guarantees 2, 9 and 16)."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from hotseat_common.config.model import BusySignal, PoolActivation
from hotseat_common.messages import (
    AcquireRequest,
    Granted,
    RenewReply,
)
from hotseat_common.subjects import Subjects
from hotseat_pool_controller.decisions.acquire import decide_acquire
from hotseat_pool_controller.model import (
    AcquireAsk,
    AttemptLease,
    Phase,
    PoolPolicy,
    PoolSnapshot,
)
from hotseat_router.activation.nats import NatsActivationClient

POLICY = PoolPolicy(
    name="gpu0",
    members=("judge", "coder"),
    max_waiters=10,
    lease_ttl_ms=15_000,
    swap_timeout_ms=600_000,
    failure_backoff_ms=5_000,
    busy_signal=BusySignal.LEASES,
    default=None,
)


def test_retried_acquire_is_told_the_time_its_lease_has_left() -> None:
    """A retried acquire gets its existing lease with the TTL it has left, not a full one."""
    snap = PoolSnapshot(
        now_ms=1_000_000,
        phase=Phase.IDLE,
        resident="judge",
        epoch=7,
        attempt_lease=AttemptLease("judge", "lease-old", 7, expiry_ms=1_004_000),
    )
    ask = AcquireAsk("judge", PoolActivation.WAIT, "r1", "client", "router", 1_300_000, "lease-new")
    reply = decide_acquire(snap, ask, POLICY, "c1").reply
    assert isinstance(reply, Granted)
    assert (reply.lease_id, reply.ttl_s) == ("lease-old", 4.0)


async def test_a_grant_that_arrives_after_its_ttl_is_not_used(nc: NatsClient, prefix: str) -> None:
    """The first grant comes back later than the TTL it carries: the client asks again
    with the same request id and uses the answer to that question instead."""
    subjects = Subjects(prefix)
    asks: list[AcquireRequest] = []

    async def controller(msg: Msg) -> None:
        asks.append(AcquireRequest.from_bytes(msg.data))
        if len(asks) == 1:
            await asyncio.sleep(0.4)  # the scripted controller answers after the TTL
            reply = Granted(lease_id="stale", ttl_s=0.3, epoch=1)
        else:
            reply = Granted(lease_id="fresh", ttl_s=5.0, epoch=2)
        await msg.respond(reply.to_bytes())

    await nc.subscribe(subjects.acquire, cb=controller)
    async with NatsActivationClient(nc, subjects, "r1") as client:
        lease = await client.acquire(
            pool="gpu0",
            member="judge",
            mode=PoolActivation.WAIT,
            attempt="a1",
            request_id="q1",
            budget_s=5,
        )
        await client.release(lease)
    assert lease.lease_id == "fresh"
    assert [(a.attempt, a.request_id) for a in asks] == [("a1", "q1"), ("a1", "q1")]
    assert asks[1].hold_s < asks[0].hold_s <= 5, "a re-ask carries what is left of the hold"


async def test_unconfirmed_renewals_lose_the_lease_at_its_ttl(nc: NatsClient, prefix: str) -> None:
    """Renewals that the controller cannot confirm (its store is down) are retried, but
    once the TTL passes without one the lease is lost, not kept on hope."""
    subjects = Subjects(prefix)
    renewals: list[float] = []

    async def acquire(msg: Msg) -> None:
        await msg.respond(Granted(lease_id="l1", ttl_s=2.0, epoch=1).to_bytes())

    async def renew(msg: Msg) -> None:
        renewals.append(asyncio.get_running_loop().time())
        await msg.respond(RenewReply(ok=False, code="controller_unavailable").to_bytes())

    await nc.subscribe(subjects.acquire, cb=acquire)
    await nc.subscribe(subjects.renew, cb=renew)
    async with NatsActivationClient(nc, subjects, "r1") as client:
        lease = await client.acquire(
            pool="gpu0",
            member="judge",
            mode=PoolActivation.WAIT,
            attempt="a2",
            request_id="q2",
            budget_s=5,
        )
        proven_until = lease.valid_until
        await asyncio.wait_for(lease.lost.wait(), 30)
        lost_at = asyncio.get_running_loop().time()
        await client.release(lease)
    # A refusal came while the lease was still proven (the first renewal is due at a third
    # of the TTL) and did not lose it; it was lost once its proof ran out.
    assert renewals, "no renewal was tried"
    assert renewals[0] < proven_until, (renewals, proven_until)
    assert lost_at >= proven_until, (lost_at, proven_until)
    assert lease.expired()
