"""Drive ``hotseat up`` as a real subprocess: read its lines, find its descendants."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PART = re.compile(r"^(\S+)\s+((?:https?|nats|redis)://\S+)$")
READY = "hotseat up: ready"


def write_config(path: Path, ports: Mapping[str, int], *, load_a_s: float = 0.1) -> Path:
    """A small stack: pool gpu0 with members a (default, loading in ``load_a_s``) and b,
    plus unpooled embed."""
    path.write_text(
        yaml.safe_dump(
            {
                "backends": [
                    {
                        "name": "a",
                        "address": f"http://127.0.0.1:{ports['a']}",
                        "pool": {"name": "gpu0", "member": "a"},
                    },
                    {
                        "name": "b",
                        "address": f"http://127.0.0.1:{ports['b']}",
                        "pool": {"name": "gpu0", "member": "b"},
                    },
                    {"name": "embed", "address": f"http://127.0.0.1:{ports['embed']}"},
                ],
                "pools": [
                    {
                        "name": "gpu0",
                        "default": "a",
                        "driver": {"kind": "sim", "gpuMemoryGiB": 24},
                        "members": [
                            {
                                "name": "a",
                                "sim": {"loadSeconds": load_a_s, "unloadSeconds": 0.05,
                                        "memoryGiB": 6, "tokensPerSecond": 400},
                            },
                            {
                                "name": "b",
                                "sim": {"loadSeconds": 0.2, "unloadSeconds": 0.05,
                                        "memoryGiB": 20, "tokensPerSecond": 400},
                            },
                        ],
                    }
                ],
                "rules": [
                    {"name": "a", "match": {"models": ["a"]}, "route": {"backends": ["a"]}},
                    {"name": "b", "match": {"models": ["b"]}, "route": {"backends": ["b"]}},
                    {"name": "embed", "match": {"models": ["embed"]},
                     "route": {"backends": ["embed"]}},
                ],
                "defaultRoute": "a",
            }
        )
    )  # fmt: skip
    return path


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (children, grandchildren...), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    status = Path(f"/proc/{pid}/status")
    try:
        return "State:\tZ" in status.read_text()
    except OSError:
        return True


def _ours(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return any(name in cmdline for name in (b"hotseat", b"nats-server", b"redis-server"))


@dataclass
class Up:
    """A running ``hotseat up`` and everything it printed so far."""

    popen: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    _queue: queue.Queue[str | None] = field(default_factory=queue.Queue)

    @classmethod
    def start(cls, argv: Sequence[str], env: Mapping[str, str]) -> Up:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **env},
        )
        up = cls(popen)
        threading.Thread(target=up._read, daemon=True).start()
        return up

    def _read(self) -> None:
        assert self.popen.stdout is not None
        with self.popen.stdout:
            for line in self.popen.stdout:
                self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, predicate: Callable[[str], bool], timeout: float) -> str:
        """The first new line matching ``predicate``; fails on exit or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no matching line after {timeout}s:\n{self.output}")
            try:
                line = self._queue.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"hotseat up exited ({self.popen.wait()}):\n{self.output}")
            self.lines.append(line)
            if predicate(line):
                return line

    def wait_ready(self, timeout: float = 180) -> dict[str, str]:
        self.wait_for(lambda line: line.startswith(READY), timeout)
        return self.parts()

    def parts(self) -> dict[str, str]:
        return {m[1]: m[2] for line in self.lines if (m := PART.match(line))}

    def example(self, command: str) -> list[str]:
        """The printed example command starting with ``command`` (curl, or the python)."""
        for line in self.lines:
            words = shlex.split(line.strip()) if line.startswith("  ") else []
            if words and Path(words[0]).name.startswith(command):
                return words
        raise AssertionError(f"no {command} example printed:\n{self.output}")

    def signal_and_wait(self, sig: signal.Signals, timeout: float = 30) -> tuple[int, float]:
        """Send ``sig``; the exit status and how long the stop took."""
        started = time.monotonic()
        self.popen.send_signal(sig)
        code = self.popen.wait(timeout)
        elapsed = time.monotonic() - started
        while (line := self._queue.get(timeout=5)) is not None:
            self.lines.append(line)
        return code, elapsed

    def kill_tree(self, seen: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        """Cleanup after a test: SIGKILL ``hotseat up``, its descendants and any process
        seen below it earlier (orphans of a failed stop) that still runs a stack binary."""
        for pid in descendants(self.popen.pid) | set(seen) | {self.popen.pid}:
            if not gone(pid) and _ours(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.popen.wait(10)


def run_json(argv: Sequence[str]) -> Any:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return json.loads(done.stdout)
