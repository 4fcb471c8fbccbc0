"""Hostile clients against one router process: what a normal client sees, and what the
router holds, while 1,000 connections trickle their headers a byte a second, then 1,000
connections are held open and idle, then 200 connections at once each send a 30 MiB
body.

The router (one worker, default limits, ``maxBodyBytes`` 32 MiB) runs on core 0; the
fast upstream (``bench/fast_upstream.js``), nats-server and this script (the normal
client and the attackers, one asyncio loop) run on core 1. The normal client sends one
ordinary chat request every ``1/--rate`` seconds (open loop, over a pool of kept-alive
connections opened before any attack) through four phases of ``--phase-seconds``:
no attack (the baseline), slow headers, idle connections, large bodies. A newcomer opens
a fresh connection every 0.25 s for one ``GET /healthz``: what it gets per phase shows
whether the attack locks new clients out. Printed: the normal client's
p50/p99 latency and failures per phase, the newcomers' answers per phase, the router's
peak RSS (VmRSS sampled every
20 ms, and the kernel's VmHWM), the configured body budget, the answers the hostile
connections got (408/431/503, or closed), and whether the peak stayed under the budget
plus a fixed overhead (the idle footprint and two copies of one ``maxBodyBytes`` body).

    .venv/bin/python bench/hostile_load.py [--phase-seconds 20] [--rate 20]

A measurement, not a test: read the figures with the machine's load beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hotseat.launcher import Managed, find_binary, free_port, spawn, start_nats, wait_for_http  # noqa: E402

ROUTER_CORE = 0
LOAD_CORE = 1
MIB = 1024 * 1024
MAX_BODY = 32 * MIB
BIG_BODY = 30 * MIB
SLOW_CONNECTIONS = 1000
IDLE_CONNECTIONS = 1000
NEWCOMER_EVERY_S = 0.25
ATTACKER = "127.0.0.2"
"""The attackers' source address: another host to the router (the normal client and the
newcomers connect from 127.0.0.1), so that it can tell them apart as it would in use."""
PING = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
BIG_CONNECTIONS = 200
BODY_COPIES = 2
"""Copies of one admitted body the router may hold beyond the budget, for one body at a
time: its pieces while they are joined, or its parsed document beside it (a body of
long strings parses to about its own size). The check's fixed overhead is the router's
idle footprint (its peak in the first phase) plus this many times ``maxBodyBytes``."""
CHAT = {"model": "bench", "messages": [{"role": "user", "content": "Say hello."}]}


@dataclass
class Phase:
    name: str
    started: float = field(default_factory=time.time)
    ended: float = 0.0
    latencies: list[float] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)
    peak_rss: int = 0


def rss(pid: int, field_name: str = "VmRSS") -> int:
    """A memory figure of ``pid`` from /proc, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field_name} for {pid}")


async def sample_rss(pid: int, phases: list[Phase]) -> None:
    while True:
        phases[-1].peak_rss = max(phases[-1].peak_rss, rss(pid))
        await asyncio.sleep(0.02)  # the sampling period


Sample = tuple[float, float | None, str]
"""When a normal request was sent (wall clock), its latency in seconds (``None`` when it
failed) and its status or error."""


def normal_client(url: str, rate: float, ready: Event, stop: Event, out: Connection) -> None:
    """The normal client, in a process of its own (so that the attackers' loop cannot
    delay it): one chat request every ``1/rate`` s until ``stop``, each timed from send
    to the last body byte; the samples go back through ``out``."""
    out.send(asyncio.run(_normal_client(url, rate, ready, stop)))


async def _normal_client(url: str, rate: float, ready: Event, stop: Event) -> list[Sample]:
    samples: list[Sample] = []
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32, keepalive_expiry=600)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        # Open the pool before any attack, as a long-running client would have it.
        await asyncio.gather(*(client.post(url, json=CHAT) for _ in range(16)))
        ready.set()

        async def one() -> None:
            sent, started = time.time(), time.perf_counter()
            try:
                response = await client.post(url, json=CHAT)
            except httpx.HTTPError as exc:
                samples.append((sent, None, type(exc).__name__))
                return
            ok = response.status_code == 200
            latency = time.perf_counter() - started if ok else None
            samples.append((sent, latency, str(response.status_code)))

        tasks: set[asyncio.Task[None]] = set()
        period = 1 / rate
        next_at = time.perf_counter()
        while not stop.is_set():
            task = asyncio.create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            next_at += period
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        await asyncio.gather(*tasks)
    return samples


def outcome(answer: asyncio.Task[bytes]) -> str:
    """The status of a connection's first answer line, else how it ended."""
    if not answer.done():
        answer.cancel()
        return "unanswered"
    if answer.cancelled():
        return "unanswered"
    exc = answer.exception()
    if exc is not None:
        return "reset" if isinstance(exc, ConnectionResetError) else "closed"
    parts = answer.result().split(b" ", 2)
    return parts[1].decode() if len(parts) > 1 else "garbled"


async def attacker_connection(
    host: str, port: int, answers: Counter[str]
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """A connection from the attackers' address; ``None`` (counted, after a second's
    pause before the caller tries again) when the connect failed."""
    try:
        return await asyncio.open_connection(host, port, local_addr=(ATTACKER, 0))
    except OSError:
        answers["connect failed"] += 1
        await asyncio.sleep(1)  # a refused connect is retried a second later
        return None


async def slow_headers(host: str, port: int, answers: Counter[str], stop: asyncio.Event) -> None:
    """One connection at a time that sends a header one byte a second until answered,
    then another, until ``stop``."""
    while not stop.is_set():
        opened = await attacker_connection(host, port, answers)
        if opened is None:
            continue
        reader, writer = opened
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: ")
        answer = asyncio.create_task(reader.readuntil(b"\r\n"))
        try:
            while not answer.done() and not stop.is_set():
                writer.write(b"a")
                await asyncio.wait([answer], timeout=1)
        except OSError:
            pass
        finally:
            if answer.done() or not stop.is_set():
                answers[outcome(answer)] += 1
            else:
                answer.cancel()
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def answered(reader: asyncio.StreamReader) -> str:
    """Read one whole answer (its body by its Content-Length); its status."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return head.split(b" ", 2)[1].decode()


async def idle_connection(host: str, port: int, answers: Counter[str], stop: asyncio.Event) -> None:
    """One connection at a time that makes one ``GET /healthz`` and then holds the
    connection open without a further request (one every 20 s, inside the router's
    keep-alive timeout), opening another when the router closes it, until ``stop``."""
    while not stop.is_set():
        opened = await attacker_connection(host, port, answers)
        if opened is None:
            continue
        reader, writer = opened
        try:
            while not stop.is_set():
                writer.write(PING)
                status = await answered(reader)
                answers[status] += 1
                if status != "200":
                    break  # refused: the router closes the connection
                closed = asyncio.create_task(reader.read(1))
                stopping = asyncio.create_task(stop.wait())
                await asyncio.wait([closed, stopping], timeout=20, return_when="FIRST_COMPLETED")
                stopping.cancel()
                if closed.done():
                    answers["closed by the router"] += 1
                    break
                closed.cancel()
        except (OSError, asyncio.IncompleteReadError):
            answers["closed by the router"] += 1
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def newcomers(host: str, port: int, seen: list[tuple[float, str]]) -> None:
    """A fresh connection every ``NEWCOMER_EVERY_S`` for one ``GET /healthz``, until
    cancelled; each (time sent, status or how it ended) goes to ``seen``."""
    while True:
        sent = time.time()
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            seen.append((sent, "connect failed"))
        else:
            writer.write(PING)
            answer = asyncio.create_task(reader.readuntil(b"\r\n"))
            await asyncio.wait([answer], timeout=30)
            seen.append((sent, outcome(answer)))
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        await asyncio.sleep(NEWCOMER_EVERY_S)


async def big_bodies(
    host: str, port: int, body: bytes, answers: Counter[str], stop: asyncio.Event
) -> None:
    """One connection at a time that sends a 30 MiB chat body at full speed (stopping
    once answered), then another, until ``stop``."""
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    view = memoryview(body)
    while not stop.is_set():
        opened = await attacker_connection(host, port, answers)
        if opened is None:
            continue
        reader, writer = opened
        writer.write(head)
        answer = asyncio.create_task(reader.readuntil(b"\r\n"))
        try:
            # The head alone is enough for the router to refuse (its Content-Length is
            # claimed from the budget before a body byte is read): give the answer a
            # moment, so that a refusal is read rather than lost to the reset that
            # closing on a client still sending causes.
            await asyncio.wait([answer], timeout=0.2)
            for at in range(0, len(body), MIB):
                if answer.done():
                    break
                writer.write(view[at : at + MIB])
                await writer.drain()
            await asyncio.wait([answer], timeout=120)
        except OSError:
            pass
        finally:
            answers[outcome(answer)] += 1
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


Attacker = Callable[[Counter[str], asyncio.Event], Coroutine[Any, Any, None]]
"""One hostile connection's loop: it counts the answers it gets until the event is set."""


async def attack(
    phases: list[Phase], name: str, seconds: float, attackers: list[Attacker]
) -> Counter[str]:
    """A phase of ``seconds`` with every attacker running; the answers they got."""
    answers: Counter[str] = Counter()
    stop = asyncio.Event()
    phases.append(Phase(name))
    tasks = [asyncio.create_task(attacker(answers, stop)) for attacker in attackers]
    await asyncio.sleep(seconds)  # the attack runs for this long
    phases[-1].ended = time.time()
    stop.set()
    await asyncio.gather(*tasks)
    return answers


def percentile(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


async def run(args: argparse.Namespace, router: Managed) -> None:
    host, port = router.url.removeprefix("http://").split(":")
    url = router.url + "/v1/chat/completions"
    ready, stop_client = multiprocessing.Event(), multiprocessing.Event()
    receiving, sending = multiprocessing.Pipe(duplex=False)
    client = multiprocessing.Process(
        target=normal_client, args=(url, args.rate, ready, stop_client, sending)
    )
    client.start()
    await asyncio.to_thread(ready.wait)
    phases = [Phase("no attack")]
    sampler = asyncio.create_task(sample_rss(router.pid, phases))
    arrivals: list[tuple[float, str]] = []
    newcomer = asyncio.create_task(newcomers(host, int(port), arrivals))
    await asyncio.sleep(args.phase_seconds)  # the baseline phase runs for this long

    port_n = int(port)
    slow_answers = await attack(
        phases,
        f"{SLOW_CONNECTIONS} slow-header connections",
        args.phase_seconds,
        [partial(slow_headers, host, port_n)] * SLOW_CONNECTIONS,
    )
    idle_answers = await attack(
        phases,
        f"{IDLE_CONNECTIONS} idle connections",
        args.phase_seconds,
        [partial(idle_connection, host, port_n)] * IDLE_CONNECTIONS,
    )
    body = orjson.dumps(CHAT)[:-2] + b',{"role":"user","content":"'
    body += b"x" * (BIG_BODY - len(body) - 4) + b'"}]}'
    big_answers = await attack(
        phases,
        f"{BIG_CONNECTIONS} x 30 MiB bodies",
        args.phase_seconds,
        [partial(big_bodies, host, port_n, body)] * BIG_CONNECTIONS,
    )
    stop_client.set()
    newcomer.cancel()
    samples: list[Sample] = await asyncio.to_thread(receiving.recv)
    client.join(30)
    sampler.cancel()
    phases[0].ended = phases[1].started
    for sent, latency, status in samples:
        phase = next((p for p in phases if p.started <= sent < p.ended), None)
        if phase is None:
            continue  # sent between phases, while attackers were stopping
        if latency is None:
            phase.failures[status] += 1
        else:
            phase.latencies.append(latency)

    print(f"\nnormal client, {args.rate:g} chat requests/s, {args.phase_seconds:g} s per phase:")
    print(f"  {'phase':<32} {'served':>6} {'p50 ms':>8} {'p99 ms':>8}  failed")
    for phase in phases:
        lat = [x * 1000 for x in phase.latencies]
        failed = ", ".join(f"{k} {v}" for k, v in phase.failures.items()) or "0"
        print(
            f"  {phase.name:<32} {len(lat):>6} {percentile(lat, 50):>8.2f}"
            f" {percentile(lat, 99):>8.2f}  {failed}"
        )
    print(f"\na new connection every {NEWCOMER_EVERY_S:g} s, GET /healthz, per phase:")
    for phase in phases:
        got = Counter(status for sent, status in arrivals if phase.started <= sent < phase.ended)
        print(f"  {phase.name:<32} " + (", ".join(f"{k} {v}" for k, v in sorted(got.items()))))
    print("\nhostile connections' answers (each connection's first answer line):")
    print("  slow headers: " + ", ".join(f"{k} {v}" for k, v in sorted(slow_answers.items())))
    print(
        "  idle (each ping's answer, and closes): "
        + ", ".join(f"{k} {v}" for k, v in sorted(idle_answers.items()))
    )
    print("  30 MiB bodies: " + ", ".join(f"{k} {v}" for k, v in sorted(big_answers.items())))
    budget = args.body_budget
    hwm = rss(router.pid, "VmHWM")
    print("\nrouter memory:")
    for phase in phases:
        print(f"  peak VmRSS, {phase.name:<32} {phase.peak_rss / MIB:8.1f} MiB")
    print(f"  VmHWM (the kernel's peak)              {hwm / MIB:8.1f} MiB")
    print(f"  body budget (--body-budget-bytes)      {budget / MIB:8.1f} MiB")
    idle = phases[0].peak_rss
    overhead = idle + BODY_COPIES * MAX_BODY
    limit = budget + overhead
    verdict = "OK" if hwm <= limit else "EXCEEDED"
    print(
        f"  check: peak {hwm / MIB:.1f} MiB <= budget + overhead (idle {idle / MIB:.1f}"
        f" + {BODY_COPIES} x maxBodyBytes {MAX_BODY / MIB:.0f}) = {limit / MIB:.1f} MiB: {verdict}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase-seconds", type=float, default=20)
    parser.add_argument("--rate", type=float, default=20, help="normal requests per second")
    parser.add_argument("--body-budget", type=int, default=256 * MIB)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = SLOW_CONNECTIONS + BIG_CONNECTIONS + 1000
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    if shutil.which("node") is None:
        sys.exit("node not found: the fast upstream is bench/fast_upstream.js")
    os.sched_setaffinity(0, {LOAD_CORE})  # this process and what it starts from now on

    with tempfile.TemporaryDirectory(prefix="hotseat-hostile-") as tmp:
        workdir = Path(tmp)
        nats = start_nats(workdir)
        upstream_port = free_port()
        upstream = subprocess.Popen(
            ["node", str(ROOT / "bench" / "fast_upstream.js"), str(upstream_port)],
            stdout=subprocess.PIPE,
        )
        assert upstream.stdout is not None
        upstream.stdout.readline()  # "ready"
        config = workdir / "hotseat.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "router": {"name": "hostile", "maxBodyBytes": MAX_BODY},
                    "backends": [{"name": "fast", "address": f"http://127.0.0.1:{upstream_port}"}],
                    "defaultRoute": "fast",
                    "unknownModels": "DefaultRoute",
                }
            )
        )
        port = free_port()
        argv = [
            find_binary("hotseat-router"), "--config", str(config), "--port", str(port),
            "--nats-url", nats.url, "--log-level", "warning",
            "--subject-prefix", f"hostile{port}", "--audit-stream", f"HOSTILE_{port}",
            "--body-budget-bytes", str(args.body_budget),
        ]  # fmt: skip
        router = spawn("router", argv, url=f"http://127.0.0.1:{port}", log_path=workdir / "r.log")
        try:
            wait_for_http(router, router.url + "/readyz", 60)
            os.sched_setaffinity(router.pid, {ROUTER_CORE})
            print(
                f"router pid {router.pid} on core {ROUTER_CORE}; upstream, NATS and load on"
                f" core {LOAD_CORE}; load average {os.getloadavg()[0]:.1f}"
            )
            asyncio.run(run(args, router))
            print(f"load average at the end {os.getloadavg()[0]:.1f}")
        finally:
            router.stop(10)
            upstream.terminate()
            upstream.wait(10)
            nats.stop()


if __name__ == "__main__":
    main()
