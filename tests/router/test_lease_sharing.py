"""A router shares a live lease between its requests for the same member, and stops
sharing it the moment it is in doubt. The controller here is scripted on real NATS, so
each test sees exactly which acquires, renewals and releases reach it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from hotseat_common.config.model import PoolActivation
from hotseat_common.errors import ErrorCode, QueueFull
from hotseat_common.messages import (
    AcquireRequest,
    DispatchFailureReport,
    ErrorReply,
    Granted,
    PoolStateChanged,
    ReleaseRequest,
    RenewReply,
    RenewRequest,
    WaitReason,
    WaitReply,
    WireModel,
)
from hotseat_common.subjects import Subjects
from hotseat_router.activation import nats as nats_activation
from hotseat_router.activation.nats import NatsActivationClient
from hotseat_router.activation.protocol import Lease
from tests.support.waiting import eventually


@dataclass
class ScriptedController:
    """Grants every acquire a new lease (once ``answering`` is set), unless ``replies``
    has a scripted answer for its request id; renewals answered by ``renew_reply``."""

    ttl_s: float = 30.0
    answering: asyncio.Event = field(default_factory=asyncio.Event)
    replies: dict[str, WireModel] = field(default_factory=dict)
    renew_reply: RenewReply = field(default_factory=lambda: RenewReply(ok=True, ttl_s=30.0))
    acquires: list[AcquireRequest] = field(default_factory=list)
    releases: list[ReleaseRequest] = field(default_factory=list)
    renewals: int = 0
    renew_requests: list[RenewRequest] = field(default_factory=list)
    reports: int = 0
    released: asyncio.Event = field(default_factory=asyncio.Event)
    renewed: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_acquire(self, msg: Msg) -> None:
        request = AcquireRequest.from_bytes(msg.data)
        self.acquires.append(request)
        reply = self.replies.get(request.request_id) or Granted(
            lease_id=f"lease-{len(self.acquires)}", ttl_s=self.ttl_s, epoch=1
        )
        await self.answering.wait()
        await msg.respond(reply.to_bytes())

    async def on_renew(self, msg: Msg) -> None:
        self.renewals += 1
        self.renew_requests.append(RenewRequest.from_bytes(msg.data))
        await msg.respond(self.renew_reply.to_bytes())
        self.renewed.set()

    async def on_release(self, msg: Msg) -> None:
        self.releases.append(ReleaseRequest.from_bytes(msg.data))
        self.released.set()

    async def on_report(self, msg: Msg) -> None:
        DispatchFailureReport.from_bytes(msg.data)
        self.reports += 1
        await msg.respond(b"{}")


@pytest.fixture
async def controller(nc: NatsClient, prefix: str) -> AsyncIterator[ScriptedController]:
    subjects = Subjects(prefix)
    scripted = ScriptedController()
    scripted.answering.set()
    subs = [
        await nc.subscribe(subjects.acquire, cb=scripted.on_acquire),
        await nc.subscribe(subjects.renew, cb=scripted.on_renew),
        await nc.subscribe(subjects.release, cb=scripted.on_release),
        await nc.subscribe(subjects.report, cb=scripted.on_report),
    ]
    await nc.flush()
    yield scripted
    for sub in subs:
        await sub.unsubscribe()


@pytest.fixture
async def client(nc: NatsClient, prefix: str) -> AsyncIterator[NatsActivationClient]:
    async with NatsActivationClient(nc, Subjects(prefix), "r1") as activation:
        yield activation


async def acquire(
    client: NatsActivationClient,
    request_id: str,
    member: str = "judge",
    mode: PoolActivation = PoolActivation.IF_IDLE,
) -> Lease:
    return await client.acquire(
        pool="gpu0",
        member=member,
        mode=mode,
        attempt=f"attempt-{request_id}",
        request_id=request_id,
        budget_s=5,
    )


async def test_requests_share_one_lease_released_by_the_last(
    client: NatsActivationClient, controller: ScriptedController, nc: NatsClient
) -> None:
    first = await acquire(client, "q1")
    second = await acquire(client, "q2")
    third = await acquire(client, "q3")
    other = await acquire(client, "q4", member="coder")
    assert [a.request_id for a in controller.acquires] == ["q1", "q4"]
    assert first.lease_id == second.lease_id == third.lease_id == "lease-1"
    assert other.lease_id == "lease-2"
    await client.release(first)
    await client.release(first)  # twice: still only one request's share
    await client.release(second)
    later = await acquire(client, "q5")  # third still holds it: shared, not asked
    assert later.lease_id == "lease-1"
    assert len(controller.acquires) == 2
    await client.release(third)
    await client.release(later)
    await asyncio.wait_for(controller.released.wait(), 5)
    await client.release(other)
    await nc.flush()
    # Released: the next request asks the controller again.
    fresh = await acquire(client, "q6")
    assert fresh.lease_id == "lease-3"
    assert [r.lease_id for r in controller.releases][:1] == ["lease-1"]


async def test_a_refused_renewal_ends_every_sharer_and_the_next_request_asks(
    client: NatsActivationClient, controller: ScriptedController
) -> None:
    controller.ttl_s = 0.6  # renewed every 0.2 s
    controller.renew_reply = RenewReply(ok=False)  # the controller no longer knows it
    first = await acquire(client, "q1")
    second = await acquire(client, "q2")
    await asyncio.wait_for(second.lost.wait(), 5)
    assert first.lost.is_set()
    assert first.expired()
    assert second.expired()
    third = await acquire(client, "q3")
    assert third.lease_id == "lease-2"
    assert not third.lost.is_set()


async def test_a_lease_whose_renewals_fall_behind_is_not_shared(
    client: NatsActivationClient, controller: ScriptedController
) -> None:
    """A renewal confirms less than half the TTL: the lease is still valid for the
    request holding it, but a new request asks the controller instead of sharing it."""
    # Renewed every 1 s; proven for 3 s, a grant is lost unrenewed only if this loop
    # stalls 2 s, so the renewal this test waits for is sent even on a loaded host.
    controller.ttl_s = 3.0
    controller.renew_reply = RenewReply(ok=True, ttl_s=1.0)  # a third of the TTL
    first = await acquire(client, "q1")
    await asyncio.wait_for(controller.renewed.wait(), 30)
    # The renewal's proof lands when its reply is read: the lease is behind from then on.
    await eventually(lambda: _shorter_than(first, first.ttl_s / 2), timeout=30, interval=0.01)
    second = await acquire(client, "q2")
    # Asked, not shared (the ids themselves shift if a grant comes too late to prove
    # anything and is asked again).
    assert controller.acquires[-1].request_id == "q2"
    assert second.lease_id != first.lease_id


async def test_a_dispatch_failure_stops_sharing(
    client: NatsActivationClient, controller: ScriptedController
) -> None:
    first = await acquire(client, "q1")
    await client.report_failure(first, request_id="q1", reason="connect refused")
    assert controller.reports == 1
    second = await acquire(client, "q2")
    assert second.lease_id == "lease-2"
    assert not first.lost.is_set()  # the controller decides whether the member is dead


async def test_requests_asking_at_once_share_the_first_grant(
    client: NatsActivationClient, controller: ScriptedController
) -> None:
    """Requests for a member that arrive while one of them is asking wait for its answer
    and share its lease: one question, one lease, released by the last of them."""
    controller.answering.clear()
    asking = [asyncio.create_task(acquire(client, f"q{i}")) for i in range(5)]
    other = asyncio.create_task(acquire(client, "o1", member="coder"))
    await eventually(lambda: _asked(controller, 1), timeout=5, interval=0.01)
    controller.answering.set()  # q0 asked first; the others came while it waited
    leases = await asyncio.gather(*asking)
    assert sorted(a.request_id for a in controller.acquires) == ["o1", "q0"]
    assert {lease.lease_id for lease in leases} == {"lease-1"}
    assert (await other).lease_id == "lease-2"
    for lease in leases:
        await client.release(lease)
    await asyncio.wait_for(controller.released.wait(), 5)
    assert [r.lease_id for r in controller.releases] == ["lease-1"]


async def test_a_refusal_is_not_shared_the_others_ask_for_themselves(
    client: NatsActivationClient, controller: ScriptedController
) -> None:
    """The first request's answer is a refusal of its own (the pool's waiter queue was
    full when it asked): the requests that waited for it ask for themselves."""
    controller.answering.clear()
    controller.replies["q0"] = ErrorReply(code=ErrorCode.POOL_QUEUE_FULL, message="full")
    first = asyncio.create_task(acquire(client, "q0", mode=PoolActivation.WAIT))
    await eventually(lambda: _asked(controller, 1), timeout=5, interval=0.01)
    second = asyncio.create_task(acquire(client, "q1", mode=PoolActivation.WAIT))
    controller.answering.set()
    with pytest.raises(QueueFull):
        await first
    lease = await second
    assert [a.request_id for a in controller.acquires] == ["q0", "q1"]
    assert lease.lease_id == "lease-2"


async def test_waiters_told_to_wait_by_another_request_wait_without_asking(
    client: NatsActivationClient,
    controller: ScriptedController,
    nc: NatsClient,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Requests held for a member (each told to wait once) wake at each change of the pool:
    the first to wake asks, the others wait for its answer. Told to wait, they wait on
    without asking; granted (the swap's commit), they share its lease, which names the
    swap they waited for."""
    monkeypatch.setattr(nats_activation, "REASK_INTERVAL_S", 60.0)  # changes alone wake them
    wait = WaitReply(reason=WaitReason.SWAP_IN_FLIGHT, epoch=1, retry_after_s=1, swap_id="s1")
    for i in range(5):
        controller.replies[f"q{i}"] = wait
    held = [
        asyncio.create_task(acquire(client, f"q{i}", mode=PoolActivation.WAIT)) for i in range(5)
    ]
    await eventually(lambda: _asked(controller, 5), timeout=5, interval=0.01)
    await _pool_changed(nc, prefix, "loading")  # everyone wakes; one asks
    await eventually(lambda: _asked(controller, 6), timeout=5, interval=0.01)
    granted = Granted(lease_id="after-commit", ttl_s=30, epoch=2, swap_id="s1")
    controller.replies.update({f"q{i}": granted for i in range(5)})
    await _pool_changed(nc, prefix, "idle")  # the commit
    leases = await asyncio.wait_for(asyncio.gather(*held), 10)
    assert len(controller.acquires) == 7, [a.request_id for a in controller.acquires]
    assert {(lease.lease_id, lease.swap_id) for lease in leases} == {("after-commit", "s1")}


async def _pool_changed(nc: NatsClient, prefix: str, phase: Literal["loading", "idle"]) -> None:
    event = PoolStateChanged(pool="gpu0", epoch=2, phase=phase, resident="judge", reason="test")
    await nc.publish(Subjects(prefix).pool_events("gpu0"), event.to_bytes())
    await nc.flush()


async def _asked(controller: ScriptedController, count: int) -> bool:
    return len(controller.acquires) >= count


async def _shorter_than(lease: Lease, seconds: float) -> bool:
    return lease.valid_until - asyncio.get_running_loop().time() < seconds


async def test_a_release_tells_the_longest_request_on_the_lease(
    client: NatsActivationClient, controller: ScriptedController
) -> None:
    """Three requests share one lease, each ending at its own time: the release the last
    one sends carries how long the longest of them ran (each from its grant or share to
    its release, as the test's own brackets around those calls bound it), so the
    controller learns the member's request times (docs/adr/0006)."""
    loop = asyncio.get_running_loop()
    spans: dict[str, tuple[float, float]] = {}  # request -> (latest start, earliest end)
    outer: dict[str, tuple[float, float]] = {}  # request -> (earliest start, latest end)
    leases: dict[str, Lease] = {}

    async def start(name: str) -> None:
        before = loop.time()
        leases[name] = await acquire(client, name)
        spans[name] = (loop.time(), 0.0)
        outer[name] = (before, 0.0)

    async def end(name: str) -> None:
        before = loop.time()
        await client.release(leases[name])
        spans[name] = (spans[name][0], before)
        outer[name] = (outer[name][0], loop.time())

    await start("q1")
    await start("q2")
    await end("q1")
    await start("q3")
    await end("q2")
    await end("q3")
    await asyncio.wait_for(controller.released.wait(), 5)
    (release,) = controller.releases
    assert release.requests == 3
    assert release.longest_s is not None
    shortest_possible = max(stop - begin for begin, stop in spans.values())
    longest_possible = max(stop - begin for begin, stop in outer.values())
    assert shortest_possible - 0.001 <= release.longest_s <= longest_possible + 0.001


async def test_a_renewal_tells_the_longest_request_that_ended_since_the_last(
    client: NatsActivationClient, controller: ScriptedController
) -> None:
    """Two requests share a lease; one ends while the other goes on (the lease is not
    released): the next renewal carries how long the ended one ran, the one after it
    nothing more (docs/adr/0006: a member whose lease is never released still has its
    request times measured)."""
    controller.ttl_s = 3.0  # renewed every 1 s
    controller.renew_reply = RenewReply(ok=True, ttl_s=3.0)
    loop = asyncio.get_running_loop()
    before = loop.time()
    first = await acquire(client, "q1")
    after = loop.time()
    second = await acquire(client, "q2")
    ending = loop.time()
    await client.release(first)
    ended = loop.time()

    async def reported() -> int | None:
        seen = controller.renew_requests
        return next((i + 1 for i, r in enumerate(seen) if r.longest_s is not None), None)

    index = await eventually(reported, timeout=30, interval=0.01)
    renewal = controller.renew_requests[index - 1]
    assert renewal.longest_s is not None
    assert (ending - after) - 0.001 <= renewal.longest_s <= (ended - before) + 0.001
    assert controller.releases == []  # second still holds the lease

    async def another() -> bool:
        return len(controller.renew_requests) > index

    await eventually(another, timeout=30, interval=0.01)
    assert controller.renew_requests[index].longest_s is None
    await client.release(second)
