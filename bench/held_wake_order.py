"""The router's part of waking requests held through a swap, in the order they wake
(docs/adr/0004, "Woken by a change, the first alone").

N requests of one router wait for a member (the router's own activation client, over a
private NATS). A stand-in for the pool controller, in a process of its own, answers them
``wait``, then announces the pool's change and times on its own clock how long the
router takes to ask again: the router's work between the notification and its question,
plus two trips through NATS. Then it grants, and the requests share the grant and
release it. Each round wakes the waiters one of two ways, alternating in one run:

- ``together``: every waiter at once (an ``asyncio.Event``, as before): the question is
  written after every waiter has run (the NATS client writes from a task of its own);
- ``first alone``: the first waiter alone, the others a turn later (``FirstThenRest``,
  as the router does now): the question is written before they run.

    .venv/bin/python bench/held_wake_order.py --held 1,10,100 --rounds 40

A measurement, not a test: the stand-in answers only what this needs (no leases, no
swap); the figures are times on a shared host, so read the two ways side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from hotseat import launcher
from hotseat_common.config.model import PoolActivation
from hotseat_common.connections import open_nats
from hotseat_common.messages import Granted, PoolStateChanged, WaitReason, WaitReply
from hotseat_common.subjects import Subjects
from hotseat_router.activation import nats as activation
from hotseat_router.activation.nats import NatsActivationClient
from hotseat_router.activation.turns import FirstThenRest

POOL, MEMBER = "gpu0", "coder"
PREFIX = "wakeorder"
WAYS = {"together": asyncio.Event, "first alone": FirstThenRest}


def control(subjects: Subjects, what: str) -> str:
    return f"{subjects.prefix}.bench.{what}"


async def respond(url: str) -> None:
    """The controller's stand-in: ``wait`` until told to announce, then the time from its
    announcement to the first question after it, and a grant."""
    subjects = Subjects(PREFIX)
    nc = await open_nats(url)
    resident = False
    epoch = 1
    announced: float | None = None
    asked_after: list[float] = []

    async def on_acquire(msg: Msg) -> None:
        nonlocal announced
        if not resident:
            reply = WaitReply(reason=WaitReason.SWAP_IN_FLIGHT, epoch=epoch, retry_after_s=30.0)
            await msg.respond(reply.to_bytes())
            return
        if announced is not None:
            asked_after.append(time.monotonic() - announced)
            announced = None
        grant = Granted(lease_id=uuid.uuid4().hex, ttl_s=60.0, epoch=epoch)
        await msg.respond(grant.to_bytes())

    async def on_reset(msg: Msg) -> None:
        nonlocal resident, epoch
        resident, epoch = False, epoch + 1
        change = PoolStateChanged(pool=POOL, epoch=epoch, phase="loading", target=MEMBER,
                                  reason="bench")  # fmt: skip
        await nc.publish(subjects.pool_events(POOL), change.to_bytes())
        await msg.respond(b"")

    async def on_announce(msg: Msg) -> None:
        nonlocal resident, epoch, announced
        resident, epoch = True, epoch + 1
        change = PoolStateChanged(pool=POOL, epoch=epoch, phase="idle", resident=MEMBER,
                                  reason="bench")  # fmt: skip
        announced = time.monotonic()
        await nc.publish(subjects.pool_events(POOL), change.to_bytes())
        await msg.respond(b"")

    async def on_report(msg: Msg) -> None:
        await msg.respond(f"{asked_after.pop() if asked_after else -1.0}".encode())

    await nc.subscribe(subjects.acquire, cb=on_acquire)
    await nc.subscribe(control(subjects, "reset"), cb=on_reset)
    await nc.subscribe(control(subjects, "announce"), cb=on_announce)
    await nc.subscribe(control(subjects, "report"), cb=on_report)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.Event().wait()


async def until(condition: object, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)  # polling for the stand-in's answers to land


async def round_trip(nc: NatsClient, client: NatsActivationClient, held: int, way: str) -> float:
    """One round with ``held`` waiters woken ``way``: the stand-in's time from its
    announcement to the router's question, in seconds."""
    subjects = Subjects(PREFIX)
    activation.FirstThenRest = WAYS[way]  # type: ignore[attr-defined,assignment]  # the next bump's
    # The client's generation tells when the reset's notification arrived (and so the
    # way is in place for the next one).
    signal = client._signal(POOL)  # noqa: SLF001
    seen = signal.generation
    await nc.request(control(subjects, "reset"), b"", timeout=5)
    await until(lambda: signal.generation > seen, "the reset's notification")
    waiting = 0

    def on_wait(_reply: WaitReply) -> None:
        nonlocal waiting
        waiting += 1

    async def one(i: int) -> None:
        lease = await client.acquire(
            pool=POOL, member=MEMBER, mode=PoolActivation.WAIT, attempt=uuid.uuid4().hex,
            request_id=f"r{i}", budget_s=60.0, on_wait=on_wait,
        )  # fmt: skip
        await client.release(lease)

    tasks = [asyncio.create_task(one(i)) for i in range(held)]
    await until(lambda: waiting >= held, "every request told to wait")
    await nc.request(control(subjects, "announce"), b"", timeout=5)
    await asyncio.gather(*tasks)
    reply = await nc.request(control(subjects, "report"), b"", timeout=5)
    return float(reply.data)


def figures(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (
        f"p50 {statistics.median(ordered) * 1e3:6.2f} ms  p99 {p99 * 1e3:6.2f} ms"
        f"  mean {statistics.fmean(ordered) * 1e3:6.2f} ms"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held", default="1,10,100")
    parser.add_argument("--rounds", type=int, default=40, help="per way and number held")
    parser.add_argument("--respond", metavar="NATS_URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.respond:
        await respond(args.respond)
        return
    work = Path(tempfile.mkdtemp(prefix="hotseat-wake-order-"))
    server = launcher.start_nats(work / "nats")
    stand_in = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--respond", server.url, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert stand_in.stdout is not None
        if (await stand_in.stdout.readline()).strip() != b"ready":
            raise SystemExit("the controller's stand-in did not start")
        nc = await open_nats(server.url)
        client = NatsActivationClient(nc, Subjects(PREFIX), "bench-router")
        await client.start()
        print("the router's question after the pool's change (the stand-in's clock)")
        for held in (int(x) for x in args.held.split(",")):
            times: dict[str, list[float]] = {way: [] for way in WAYS}
            for _ in range(args.rounds):
                for way in WAYS:
                    times[way].append(await round_trip(nc, client, held, way))
            for way, values in times.items():
                print(f"  {held:>3} held, {way:<12} {figures(values)}  ({len(values)} rounds)")
        await client.stop()
        await nc.close()
    finally:
        stand_in.terminate()
        await asyncio.wait_for(stand_in.wait(), 10)
        server.stop(5)


if __name__ == "__main__":
    asyncio.run(main())
