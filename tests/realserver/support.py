"""Helpers for tests with real ``llama-server`` members: configs, requests, observation."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

from hotseat.launcher import free_port
from hotseat_pool_controller.drivers.processgroup import read_pid_file
from tests.realserver.conftest import Llama

MEMBERS = {"small": "tiny-small", "large": "tiny-large"}
"""Pool member -> generated model it serves."""
CONTEXT = 4096
"""Tokens of context per server, shared by its slots."""
PARALLEL = 2
"""Slots per server (``-np``)."""


def member_command(llama: Llama, model: str, port: int, path: str | None = None) -> list[str]:
    """The argv of a real ``llama-server`` serving ``model`` (from ``path``) on ``port``."""
    return [
        llama.server, "-m", path or llama.models[model], "--alias", model,
        "--host", "127.0.0.1", "--port", str(port),
        "-c", str(CONTEXT), "-np", str(PARALLEL), "-t", "1", "--metrics",
    ]  # fmt: skip


def llama_config(
    llama: Llama,
    data_dir: Path,
    *,
    grace: str = "2s",
    pool: dict[str, Any] | None = None,
    model_paths: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Pool ``cpu0`` of two real servers: ``small`` (default) and ``large``, judged busy by
    leases and their real ``/slots``. Rules as in the sim activation tests."""
    ports = {name: free_port() for name in MEMBERS}
    return {
        "router": {"name": "r", "requestTimeout": "60s"},
        "backends": [
            {
                "name": name,
                "address": f"http://127.0.0.1:{port}",
                "timeout": "30s",
                "pool": {"name": "cpu0", "member": name},
            }
            for name, port in ports.items()
        ],
        "pools": [
            {
                "name": "cpu0",
                "default": "small",
                "swapBudget": "60s",
                "swapTimeout": "90s",
                "leaseTtl": "3s",
                "busySignal": "leasesAndSlots",
                "driver": {
                    "kind": "process",
                    "stopGracePeriod": grace,
                    "readyTimeout": "60s",
                    "dataDir": str(data_dir),
                },
                "members": [
                    {
                        "name": name,
                        "process": {
                            "command": member_command(
                                llama, model, ports[name], (model_paths or {}).get(name)
                            )
                        },
                    }
                    for name, model in MEMBERS.items()
                ],
                **(pool or {}),
            }
        ],
        "rules": [
            {
                "name": "prefer-large-ifidle",
                "match": {"models": ["either"]},
                "route": {"backends": ["large", "small"], "poolActivation": "IfIdle"},
            },
            {
                "name": "prefer-large-wait",
                "match": {"models": ["either-wait"]},
                "route": {"backends": ["large", "small"], "poolActivation": "Wait"},
            },
            {"name": "small", "match": {"models": ["small"]}, "route": {"backends": ["small"]}},
            {"name": "large", "match": {"models": ["large"]}, "route": {"backends": ["large"]}},
        ],
    }


def port_of(config: dict[str, Any], member: str) -> int:
    backend = next(b for b in config["backends"] if b["name"] == member)
    return int(backend["address"].rsplit(":", 1)[1])


def chat_body(model: str, max_tokens: int, *, stream: bool = False) -> dict[str, Any]:
    """A chat request that generates exactly ``max_tokens`` tokens (EOS ignored)."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hello world"}],
        "max_tokens": max_tokens,
        "stream": stream,
        "temperature": 0,
        "ignore_eos": True,
    }


async def chat(
    url: str, model: str, max_tokens: int = 4, *, request_id: str | None = None
) -> httpx.Response:
    headers = {"x-hotseat-request-id": request_id} if request_id else {}
    async with httpx.AsyncClient(timeout=90, trust_env=False) as client:
        return await client.post(
            f"{url}/v1/chat/completions", json=chat_body(model, max_tokens), headers=headers
        )


@dataclass
class Stream:
    """A streaming chat request in the background; ``task`` returns what it saw."""

    task: asyncio.Task[StreamResult]
    first_chunk_at: float


@dataclass
class StreamResult:
    status: int
    backend: str | None
    chunks: int
    finished: bool
    """The last chunk carried a ``finish_reason`` and ``[DONE]`` came."""
    ended_at: float
    error: str | None = None


@asynccontextmanager
async def streaming(url: str, model: str, max_tokens: int) -> AsyncIterator[Stream]:
    """A streaming request (to the router, or straight to a member) that is flowing: its
    first content chunk has arrived. Cancelled on exit if still running."""
    first = asyncio.get_running_loop().create_future()

    async def run() -> StreamResult:
        chunks, done, finish_reason, backend, status = 0, False, False, None, 0
        try:
            async with (
                httpx.AsyncClient(timeout=90, trust_env=False) as client,
                client.stream(
                    "POST",
                    f"{url}/v1/chat/completions",
                    json=chat_body(model, max_tokens, stream=True),
                ) as response,
            ):
                status, backend = response.status_code, response.headers.get("x-hotseat-backend")
                if status != 200:
                    await response.aread()
                    return StreamResult(status, backend, 0, False, time.time(), response.text)
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        done = True
                        continue
                    chunk = json.loads(line[6:])
                    if chunk["choices"] and chunk["choices"][0].get("finish_reason"):
                        finish_reason = True
                    chunks += 1
                    if not first.done():
                        first.set_result(time.time())
        except httpx.HTTPError as exc:
            return StreamResult(status, backend, chunks, False, time.time(), repr(exc))
        finally:
            if not first.done():
                first.set_result(time.time())
        return StreamResult(status, backend, chunks, done and finish_reason, time.time())

    task = asyncio.create_task(run())
    first_at = await first
    if task.done() and task.result().status != 200:
        raise AssertionError(f"stream failed: {task.result()}")
    try:
        yield Stream(task, first_at)
    finally:
        if not task.done():
            task.cancel()


async def busy_slots(port: int) -> int:
    """How many of the server's slots are processing, from its own ``/slots``."""
    async with httpx.AsyncClient(timeout=5, trust_env=False) as client:
        slots = (await client.get(f"http://127.0.0.1:{port}/slots")).json()
    return sum(1 for slot in slots if slot["is_processing"])


async def slots_busy(port: int) -> bool:
    return await busy_slots(port) > 0


@asynccontextmanager
async def hanging(url: str, port: int, model: str) -> AsyncIterator[None]:
    """Add a long non-streaming request to whatever the member at ``url`` is doing, and
    wait until it occupies a slot of its own.

    With a non-streaming request in flight, ``llama-server`` ignores SIGTERM every time
    (12 of 12 tries here, and every test run since); with only a stream in flight it did
    in 12 tries of 16, and otherwise stopped the stream and exited within 0.1 s. Tests
    of the escalation add one, so the hang they check against is certain.
    """
    before = await busy_slots(port)
    task = asyncio.create_task(chat(url, model, max_tokens=1900))
    try:
        deadline = time.monotonic() + 30
        while await busy_slots(port) <= before:
            if task.done() or time.monotonic() > deadline:
                raise AssertionError(f"the request did not take a slot: {task}")
            await asyncio.sleep(0.02)  # llama-server's /slots is polled: it announces nothing
        yield
    finally:
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def pid_of(data_dir: Path, member: str, pool: str = "cpu0") -> int | None:
    record = read_pid_file(data_dir / pool / f"{member}.pid")
    return None if record is None else record.pid


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def log_events(text: str, *names: str) -> list[dict[str, Any]]:
    """The JSON log lines of a service whose ``event`` is one of ``names``, in order."""
    found = []
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") in names:
            found.append(entry)
    return found


def at(entry: dict[str, Any]) -> float:
    """A log entry's time, in seconds since the epoch."""
    return datetime.fromisoformat(entry["timestamp"]).timestamp()


@dataclass
class Sample:
    time: float
    pids: dict[str, list[int]]
    """Member -> live server processes serving it."""
    open_ports: dict[str, bool]


@dataclass
class Watcher:
    """Samples, every few milliseconds and independently of the controller, which member
    server processes run below ``parent`` (the controller) and which member ports accept
    connections."""

    parent: int
    ports: dict[str, int]
    samples: list[Sample] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    def _sample(self) -> Sample:
        marks = {member: f"--port\0{port}\0".encode() for member, port in self.ports.items()}
        pids: dict[str, list[int]] = {member: [] for member in self.ports}
        try:
            children = psutil.Process(self.parent).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        for child in children:
            try:
                if child.status() == psutil.STATUS_ZOMBIE:
                    continue
                cmdline = Path(f"/proc/{child.pid}/cmdline").read_bytes()
            except (OSError, psutil.Error):
                continue
            for member, mark in marks.items():
                if mark in cmdline:
                    pids[member].append(child.pid)
        open_ports = {member: port_open(port) for member, port in self.ports.items()}
        return Sample(time.time(), pids, open_ports)

    async def _run(self) -> None:
        while True:
            self.samples.append(await asyncio.to_thread(self._sample))
            await asyncio.sleep(0.002)  # the sampling period of an outside observer, no wait

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def wait_seen(self, member: str, timeout: float = 30) -> Sample:
        """The first sample with ``member``'s process, waiting for one if need be."""
        deadline = time.monotonic() + timeout
        while not any(self.seen(member)):
            if time.monotonic() > deadline:
                raise AssertionError(f"the watcher never saw {member}'s process")
            await asyncio.sleep(0.02)  # until the sampler's next sample
        return next(iter(self.seen(member)))

    def overlaps(self) -> list[Sample]:
        """Samples where two members had a process or an open port at once."""
        return [
            s
            for s in self.samples
            if sum(bool(s.pids[m]) or s.open_ports[m] for m in self.ports) > 1
        ]

    def seen(self, member: str) -> Iterable[Sample]:
        return (s for s in self.samples if s.pids[member])
