"""What publishing an audit event costs the process that publishes it: CPU µs per event
for Hotseat's publisher (``hotseat_common.audit_stream.AuditPublisher``: each event a
message of its own with its own JetStream ack, the acks collected on one subscription)
against the same batches sent with nats-py's ``publish_async`` (a future per message,
which the publisher used before), and core NATS publishes with no ack at all (the floor
of one message per event). The three ways alternate in one run against one private
nats-server; each round sends ``--events`` events in batches of ``--batch`` (a busy
router's batch), ``--linger`` seconds apart. Every way stores each event once, which the
run checks from the stream. This is a measurement, not a test.

    .venv/bin/python bench/audit_publish.py [--rounds 5] [--events 20000] [--batch 64]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path

from nats.aio.client import Client as NatsClient
from nats.js.api import Header
from prometheus_client import CollectorRegistry

from hotseat.launcher import start_nats
from hotseat_common.audit_stream import AuditPublisher, AuditStreamSpec, ensure_audit_stream
from hotseat_common.connections import open_nats
from hotseat_common.messages.audit import encode_event
from hotseat_common.metrics import AuditPublishMetrics
from hotseat_common.subjects import Subjects

Events = list[tuple[str, bytes]]
Way = Callable[[NatsClient, Subjects, Events, argparse.Namespace], Awaitable[None]]


def _events(count: int) -> Events:
    return [
        encode_event(
            "request",
            "served",
            {
                "request_id": uuid.uuid4().hex,
                "router": "r1",
                "rule": "chat",
                "pool": "gpu0",
                "member": "a",
                "backend": "p0a",
                "status": 200,
                "duration_ms": 12.5,
            },
        )
        for _ in range(count)
    ]


def _batches(events: Events, size: int) -> list[Events]:
    return [events[i : i + size] for i in range(0, len(events), size)]


async def hotseat_publisher(
    nc: NatsClient, subjects: Subjects, events: Events, args: argparse.Namespace
) -> None:
    publisher = AuditPublisher(nc, subjects, AuditPublishMetrics(CollectorRegistry()))
    publisher.start()
    for batch in _batches(events, args.batch):
        for event_id, data in batch:
            publisher.emit_encoded("request", "served", event_id, data)
        await asyncio.sleep(args.linger)
    if not await publisher.flush(60):
        raise SystemExit("the publisher never got its acks")
    await publisher.close(5)


async def publish_async(
    nc: NatsClient, subjects: Subjects, events: Events, args: argparse.Namespace
) -> None:
    js = nc.jetstream()
    subject = subjects.audit("request", "served")
    for batch in _batches(events, args.batch):
        futures = [
            await js.publish_async(subject, data, headers={Header.MSG_ID: event_id})
            for event_id, data in batch
        ]
        await asyncio.wait(futures, timeout=10)
        await asyncio.sleep(args.linger)


async def no_ack(
    nc: NatsClient, subjects: Subjects, events: Events, args: argparse.Namespace
) -> None:
    subject = subjects.audit("request", "served")
    for batch in _batches(events, args.batch):
        for event_id, data in batch:
            await nc.publish(subject, data, headers={Header.MSG_ID: event_id})
        await asyncio.sleep(args.linger)
    await nc.flush()


WAYS: dict[str, Way] = {
    "AuditPublisher (acks on one subscription)": hotseat_publisher,
    "publish_async (a future per event)": publish_async,
    "core publish, no ack (floor)": no_ack,
}


async def one_round(url: str, way: Way, args: argparse.Namespace) -> tuple[float, float]:
    """CPU µs per event, and NATS messages received per event (acks)."""
    nc = await open_nats(url)
    prefix = "ap" + uuid.uuid4().hex[:8]
    subjects = Subjects(prefix)
    stream = f"AUDIT_{prefix}"
    js = nc.jetstream()
    await ensure_audit_stream(js, AuditStreamSpec(name=stream, subjects=subjects))
    events = _events(args.events)
    received = nc.stats["in_msgs"]
    start = time.process_time()
    await way(nc, subjects, events, args)
    cpu = time.process_time() - start
    received = nc.stats["in_msgs"] - received
    stored = (await js.stream_info(stream)).state.messages
    if stored != len(events):
        raise SystemExit(f"{stored} stored of {len(events)}")
    await js.delete_stream(stream)
    await nc.close()
    return cpu / len(events) * 1e6, received / len(events)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--linger", type=float, default=0.01)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hotseat-audit-publish-") as work:
        server = start_nats(Path(work))
        try:
            cpu: dict[str, list[float]] = defaultdict(list)
            acks: dict[str, float] = {}
            for n in range(args.rounds):
                ways = list(WAYS.items())
                for name, way in ways if n % 2 == 0 else reversed(ways):
                    micros, acks[name] = await one_round(server.url, way, args)
                    cpu[name].append(micros)
            print(
                f"{args.events} events per round, batches of {args.batch}, {args.rounds} rounds"
                " (CPU µs per event of the publishing process: median, min to max)"
            )
            for name, values in cpu.items():
                print(
                    f"  {name:44s} {statistics.median(values):6.1f}"
                    f"  ({min(values):.1f} to {max(values):.1f})"
                    f"  messages received per event {acks[name]:.2f}",
                    flush=True,
                )
        finally:
            server.stop()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
