"""An asyncio TCP proxy that injects network faults between a client and a server.

Tests put it in front of NATS, Redis, PostgreSQL or a backend and switch its mode while
traffic flows::

    with FaultProxy(redis_port) as proxy:           # clients connect to proxy.port
        proxy.blackhole()                           # bytes are held, nothing arrives
        proxy.pass_()                               # held bytes flow again, in order

The proxy runs its own event loop in a thread, so it keeps forwarding while the test's
loop is blocked (starting a service waits synchronously for it to be ready); every
method is called from the test's thread.

Modes, per direction (``up``: client to server, ``down``: server to client) or both:

- ``pass``: bytes are forwarded at once;
- ``latency``: each chunk is forwarded ``seconds`` after it was read, order kept;
- ``blackhole``: bytes are read and held, nothing is forwarded (a network partition:
  TCP does not lose data, so when the mode returns to ``pass`` the held bytes flow,
  unless either side gave up and closed the connection meanwhile);
- ``close after N bytes``: forward ``N`` more bytes on each connection, then close it.

``reset()`` aborts every open connection with a TCP RST, discarding held bytes, and
refuses (RST at once) new connections until another mode is set. ``when_seen`` switches
a direction to ``blackhole`` the moment a chunk containing a pattern is read, before
that chunk is forwarded, and sets an event (precise faults: "the ack never arrives").
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Self

CHUNK = 65536


class Mode(StrEnum):
    PASS = "pass"
    LATENCY = "latency"
    BLACKHOLE = "blackhole"
    CLOSE_AFTER = "close_after"


UP = "up"
DOWN = "down"
BOTH = (UP, DOWN)


@dataclass
class _Direction:
    mode: Mode = Mode.PASS
    latency: float = 0.0
    budget: int = 0
    """Bytes each connection may still forward in ``close_after`` mode."""
    epoch: int = 0
    """Bumped on every mode change, so ``close_after`` budgets restart per connection."""
    flowing: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.flowing.set()

    def set(self, mode: Mode, *, latency: float = 0.0, budget: int = 0) -> None:
        self.mode, self.latency, self.budget = mode, latency, budget
        self.epoch += 1
        if mode is Mode.BLACKHOLE:
            self.flowing.clear()
        else:
            self.flowing.set()


@dataclass
class _Trigger:
    direction: str
    pattern: bytes
    seen: threading.Event
    action: Callable[[], None] | None
    hold: bool


@dataclass(eq=False)
class _Conn:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closed: bool = False

    def abort(self) -> None:
        """Close both sides with a TCP RST (SO_LINGER 0)."""
        self.closed = True
        for writer in (self.client, self.server):
            if writer is None:
                continue
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        for task in self.tasks:
            task.cancel()

    def close(self) -> None:
        self.closed = True
        for writer in (self.client, self.server):
            if writer is not None:
                writer.close()
        for task in self.tasks:
            task.cancel()


class FaultProxy:
    """Listens on ``127.0.0.1:port`` and forwards to ``target_host:target_port``."""

    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._dirs = {UP: _Direction(), DOWN: _Direction()}
        self._refusing = False
        self._conns: set[_Conn] = set()
        self._triggers: list[_Trigger] = []
        self.accepted = 0
        self.forwarded = {UP: 0, DOWN: 0}

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> Self:
        """Listen on a free port, serving from a thread of its own."""
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(10) or self._server is None:
            raise RuntimeError("fault proxy did not start")
        return self

    def _serve(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._accept, "127.0.0.1", 0)
            )
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the proxy's loop and wait for it."""

        async def run() -> None:
            fn()

        self._run(run())

    def _run(self, coro: Coroutine[object, object, None]) -> None:
        if self._loop is None:
            raise RuntimeError("fault proxy not started")
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def stop(self) -> None:
        if self._loop is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for conn in list(self._conns):
                conn.abort()
            await asyncio.sleep(0)  # one loop turn: the aborted transports close their sockets

        with contextlib.suppress(Exception):
            self._run(shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def url(self, scheme: str, path: str = "") -> str:
        """``scheme://127.0.0.1:<proxy port><path>``, e.g. ``url("redis", "/0")``."""
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    @property
    def connections(self) -> int:
        return len(self._conns)

    # --- modes --------------------------------------------------------------------------

    def _set(
        self,
        directions: tuple[str, ...] | str,
        mode: Mode,
        *,
        latency: float = 0.0,
        budget: int = 0,
    ) -> None:
        names = (directions,) if isinstance(directions, str) else directions

        def apply() -> None:
            self._refusing = False
            for name in names:
                self._dirs[name].set(mode, latency=latency, budget=budget)

        self._call(apply)

    def pass_(self, directions: tuple[str, ...] | str = BOTH) -> None:
        """Forward at once (held bytes flow again)."""
        self._set(directions, Mode.PASS)

    def latency(self, seconds: float, directions: tuple[str, ...] | str = BOTH) -> None:
        """Forward each chunk ``seconds`` after it was read."""
        self._set(directions, Mode.LATENCY, latency=seconds)

    def blackhole(self, directions: tuple[str, ...] | str = BOTH) -> None:
        """Hold every byte: nothing arrives, nobody is told."""
        self._set(directions, Mode.BLACKHOLE)

    def close_after(self, n_bytes: int, directions: tuple[str, ...] | str = BOTH) -> None:
        """Forward ``n_bytes`` more per connection and direction, then close the connection."""
        self._set(directions, Mode.CLOSE_AFTER, budget=n_bytes)

    def reset(self) -> None:
        """RST every open connection (held bytes are lost) and refuse new ones."""

        def apply() -> None:
            for conn in list(self._conns):
                conn.abort()
            self._conns.clear()
            self._refusing = True
            for direction in self._dirs.values():
                direction.set(Mode.PASS)

        self._call(apply)

    def when_seen(
        self,
        pattern: bytes,
        direction: str,
        action: Callable[[], None] | None = None,
        *,
        hold: bool = True,
    ) -> threading.Event:
        """The first time a chunk containing ``pattern`` is read in ``direction``: run
        ``action`` (in the proxy's thread) and, with ``hold``, blackhole that direction
        (that chunk included) before anything is forwarded. The returned event is set then;
        await it with :func:`seen`."""
        event = threading.Event()
        trigger = _Trigger(direction, pattern, event, action, hold)
        self._call(lambda: self._triggers.append(trigger))
        return event

    # --- forwarding ---------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(client=writer)
        if self._refusing:
            conn.abort()
            return
        self.accepted += 1
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            conn.abort()
            return
        conn.server = server_writer
        self._conns.add(conn)
        loop = asyncio.get_running_loop()
        up: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        down: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        conn.tasks = [
            loop.create_task(self._read(conn, UP, reader, up)),
            loop.create_task(self._write(conn, UP, up, server_writer)),
            loop.create_task(self._read(conn, DOWN, server_reader, down)),
            loop.create_task(self._write(conn, DOWN, down, writer)),
        ]
        await asyncio.gather(*conn.tasks, return_exceptions=True)
        self._conns.discard(conn)
        if not conn.closed:
            conn.close()

    async def _read(
        self,
        conn: _Conn,
        name: str,
        reader: asyncio.StreamReader,
        queue: asyncio.Queue[tuple[float, bytes] | None],
    ) -> None:
        try:
            while data := await reader.read(CHUNK):
                for trigger in self._triggers:
                    if (
                        trigger.direction == name
                        and not trigger.seen.is_set()
                        and trigger.pattern in data
                    ):
                        if trigger.hold:
                            self._dirs[name].set(Mode.BLACKHOLE)
                        if trigger.action is not None:
                            trigger.action()
                        trigger.seen.set()
                direction = self._dirs[name]
                delay = direction.latency if direction.mode is Mode.LATENCY else 0.0
                queue.put_nowait((time.monotonic() + delay, data))
        except (ConnectionError, OSError):
            pass
        queue.put_nowait(None)

    async def _write(
        self,
        conn: _Conn,
        name: str,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        writer: asyncio.StreamWriter,
    ) -> None:
        direction = self._dirs[name]
        budget_epoch, budget = -1, 0
        try:
            while (item := await queue.get()) is not None:
                due, data = item
                await asyncio.sleep(max(0.0, due - time.monotonic()))  # injected latency
                await direction.flowing.wait()
                if direction.mode is Mode.CLOSE_AFTER:
                    if budget_epoch != direction.epoch:
                        budget_epoch, budget = direction.epoch, direction.budget
                    if len(data) >= budget:
                        writer.write(data[:budget])
                        with contextlib.suppress(ConnectionError, OSError):
                            await writer.drain()
                        conn.close()
                        return
                    budget -= len(data)
                writer.write(data)
                self.forwarded[name] += len(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        # One side finished: end the whole connection (both protocols here are duplex).
        if not conn.closed:
            conn.close()


async def seen(event: threading.Event, timeout: float) -> None:
    """Wait for a :meth:`FaultProxy.when_seen` event without blocking the test's loop."""
    if not await asyncio.to_thread(event.wait, timeout):
        raise AssertionError(f"the proxy did not see the pattern within {timeout}s")
