"""A stack's NATS traffic, each message with the moment it was seen: the activation
questions (acquire, release, cancel), the controller's answers to them and the pool
events, for a bench to read beside its clients' own times.

It runs as a process of its own, so that the moments it writes are not late by the
bench's work (its clients share the bench's event loop). A plain subscriber beside the
controller's queue group, it gets a copy of every question as the controller does, and
of every answer on its way to the router's inbox: the moment it writes for a grant is
the controller's answer, on the host's clock (the clients' and the audit trail's).

    tap = Tap.start(nats_url, ["hotseat.pool.>", "_INBOX.>"], out)   # from a bench
    ...
    tap.stop()
    messages = tap.read()

One JSON line per message: ``t`` (Unix seconds), ``subject``, ``reply`` (the inbox a
question's answer goes to, if any) and ``data`` (the message, as text).

A module of the benchmarks, not of Hotseat: ``bench/`` scripts import it as ``wire_tap``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

READY = "ready"


@dataclass
class Message:
    t: float
    """When the tap saw it (Unix seconds)."""
    subject: str
    reply: str | None
    data: dict[str, Any]


class Tap:
    """The tap process of one bench run."""

    def __init__(self, proc: subprocess.Popen[str], out: Path) -> None:
        self.proc, self.out = proc, out

    @classmethod
    def start(cls, nats_url: str, subjects: list[str], out: Path) -> Tap:
        proc = subprocess.Popen(
            [sys.executable, __file__, nats_url, str(out), *subjects],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()  # its subscriptions are in place once it says so
        if line.strip() != READY:
            proc.kill()
            raise RuntimeError(f"the NATS tap did not start (it said {line!r})")
        return cls(proc, out)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)

    def read(self) -> list[Message]:
        messages = []
        for line in self.out.read_text().splitlines():
            doc = json.loads(line)
            try:
                data = json.loads(doc["data"])
            except ValueError:
                continue  # not a JSON message (none of those the benches read)
            if isinstance(data, dict):
                messages.append(Message(doc["t"], doc["subject"], doc["reply"], data))
        return messages


async def _tap(nats_url: str, out: TextIO, subjects: list[str]) -> None:
    import nats  # noqa: PLC0415 - the tap process's only dependency

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    async def seen(msg: Any) -> None:
        line = {
            "t": time.time(),
            "subject": msg.subject,
            "reply": msg.reply or None,
            "data": msg.data.decode(errors="replace"),
        }
        out.write(json.dumps(line) + "\n")

    nc = await nats.connect(nats_url)
    for subject in subjects:
        await nc.subscribe(subject, cb=seen)
    await nc.flush()
    print(READY, flush=True)
    await stop.wait()
    await nc.drain()
    out.flush()


def main() -> None:
    nats_url, path, *subjects = sys.argv[1:]
    with Path(path).open("w") as out:
        asyncio.run(_tap(nats_url, out, subjects))


if __name__ == "__main__":
    main()
