"""The router's HTTP connections: uvicorn's httptools protocol with limits on what a
client may make the router hold before a request reaches the app.

- A request's head (request line and headers) larger than ``max_header_bytes``, or with
  more than ``max_headers`` headers, is answered 431 and the connection closed. The
  bytes are counted as they arrive, so at most one read past the limit is ever held.
- A head not complete ``header_timeout`` seconds after the connection opened (or, on a
  kept-alive connection, after the request's first byte) is answered 408 and closed.
- A connection that would make more than ``max_connections`` open at once in this
  process either makes room (the peer holding the most connections closes the one of
  them that has waited longest for a request's head) or, when its own peer holds as
  many or the holder has none waiting, has its request answered 503 with
  ``Retry-After`` and is closed (:mod:`hotseat_router.slots`).
- A request the parser cannot read gets 400 with the OpenAI error body.
- An ``Upgrade`` request (WebSocket, h2c) is served as plain HTTP/1.1: the router
  upgrades to nothing.
- A client that stops reading its response (the connection's write buffer stays full
  for ``write_timeout`` seconds) is dropped: the connection is aborted, which the app
  sees as the client leaving (the upstream request is cancelled, the lease released).

The app learns that a request's client left from the connection itself
(:class:`_ClientLeft`, the scope extension ``hotseat_router.asgi.CLIENT_LEFT``): a
callback the request registers is called when the connection is lost, instead of a task
per request awaiting ``receive()`` until ``http.disconnect``.

What a connection writes in one event-loop turn goes out as one socket write
(:class:`_Coalescing`): a response's head and a body already at hand, a stream's last
chunk and its terminator, are one segment and one system call, not two.

Every such answer has the OpenAI error body and an ``x-hotseat-request-id``; none of
them reaches the app, so none is audited (there is no request to audit).

An answer that closes the connection before the request was read to its end (these, and
the app's 413 and 503 ``body_budget_exceeded``) closes it *lingering*: the answer is
sent, the router's side is shut for writing, and whatever the client still sends is read
and thrown away for up to ``LINGER_S`` before the socket is closed. Closing at once would
make the kernel answer the client's next bytes with a reset, which can destroy the
answer before the client reads it (it saw a connection error instead of a 413).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from hotseat_common.errors import HotseatError
from hotseat_common.logging import get_logger
from hotseat_router.asgi import CLIENT_LEFT, OnClientLeft, Receive, Scope, Send
from hotseat_router.errors import (
    HeadersTooLarge,
    InvalidRequest,
    ReadTimeout,
    TooManyConnections,
    error_answer,
)
from hotseat_router.headers import REQUEST_ID_B, request_id_of
from hotseat_router.slots import ConnectionSlots

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_header_bytes: int
    max_headers: int
    header_timeout: float
    max_connections: int
    write_timeout: float


LINGER_S = 2.0
"""How long a connection closed early keeps reading (and discarding) what the client
still sends, so that its answer is read before the socket goes."""


COALESCE_MAX = 64 * 1024
"""Held writes past this many bytes go out at once, without waiting for the turn's end."""


class _Coalescing:
    """The connection's transport, with the writes of one event-loop turn joined into one:
    the first write of a turn schedules the flush (``call_soon``), the others join it.
    Everything that ends or shuts the connection flushes first, so bytes keep their order
    and none is lost; an abort drops them, as it drops the transport's own buffer."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._size = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(bytes(data) if type(data) is not bytes else data)
        self._size += len(data)
        if self._size >= COALESCE_MAX:
            self.flush()

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        held = self._held
        if not held:
            return
        self._held = []
        self._size = 0
        if not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._size

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = []
        self._size = 0
        self._transport.abort()


class _Lingering:
    """The transport as a request's cycle sees it: a ``close`` shuts the router's side for
    writing and closes the socket after ``LINGER_S`` (or once the client closes its own)."""

    def __init__(self, transport: asyncio.Transport, protocol: LimitedHttpProtocol) -> None:
        self._transport = transport
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self._protocol.lingering or self._transport.is_closing()

    def close(self) -> None:
        self._protocol.linger()


class _ClientLeft:
    """A connection's ``CLIENT_LEFT`` (``hotseat_router.asgi``): one per connection, shared
    by its requests, which are handled one at a time (a pipelined request's app starts
    once the response before it is complete). It holds no reference to the connection."""

    __slots__ = ("_callback", "_lost")

    def __init__(self) -> None:
        self._callback: OnClientLeft | None = None
        self._lost = False

    def watch(self, callback: OnClientLeft) -> None:
        if self._lost:
            callback()
            return
        self._callback = callback

    def unwatch(self, callback: OnClientLeft) -> None:
        # ``==``: a bound method is a new object each time it is looked up; it equals
        # another of the same function on the same object. A request that finishes after
        # the next one registered does not undo the next one's registration.
        if self._callback == callback:
            self._callback = None

    def response_complete(self) -> None:
        """The current request's response is sent: its client leaving is no news."""
        self._callback = None

    def connection_lost(self) -> None:
        self._lost = True
        callback, self._callback = self._callback, None
        if callback is not None:
            callback()


_SLOTS = "hotseat_connection_slots"


def _slots_of(state: ServerState) -> ConnectionSlots[LimitedHttpProtocol]:
    """The connection slots of the server whose shared state is ``state``."""
    slots: ConnectionSlots[LimitedHttpProtocol] | None = getattr(state, _SLOTS, None)
    if slots is None:
        slots = ConnectionSlots()
        setattr(state, _SLOTS, slots)
    return slots


class _HeadRefused(Exception):
    """Raised from a parser callback to stop parsing a head that passed a limit."""


def _answer(exc: HotseatError) -> tuple[bytes, bytes]:
    """The raw HTTP/1.1 answer for ``exc``, closing the connection, and its request id."""
    status, headers, body = error_answer(exc)
    request_id = request_id_of(None).encode()
    lines = [STATUS_LINE[status]]
    lines.extend(name + b": " + value + b"\r\n" for name, value in headers)
    lines.append(REQUEST_ID_B + b": " + request_id + b"\r\n")
    if (b"connection", b"close") not in headers:
        lines.append(b"connection: close\r\n")
    return b"".join([*lines, b"\r\n", body]), request_id


async def _too_many_connections(_scope: Scope, _receive: Receive, send: Send) -> None:
    """The app of a connection past ``max_connections``: 503, then close."""
    status, headers, body = error_answer(
        TooManyConnections("the router has too many open connections; retry shortly")
    )
    headers.append((REQUEST_ID_B, request_id_of(None).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`ConnectionLimits` (module docstring)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: ConnectionLimits,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._limits = limits
        self._in_head = False
        self._began_in_this_read = False
        # The current head's size is known two ways, each a lower bound: the whole reads
        # that arrived while it was incomplete, and what the parser has handed over.
        self._read_head_bytes = 0
        self._parsed_head_bytes = 0
        self._headers = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self.lingering = False
        self._client_left = left = _ClientLeft()
        self._hook: dict[object, object] = {"watch": left.watch, "unwatch": left.unwatch}
        self._extensions = {CLIENT_LEFT: self._hook}
        self._slots = _slots_of(server_state)
        self._peer = ""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = _Coalescing(transport, self.loop)  # type: ignore[assignment]
        self._peer = self.client[0] if self.client else ""
        self._slots.opened(self._peer)
        if len(self.connections) > self._limits.max_connections and not self._make_room():
            log.debug("connection_refused", reason="too_many_connections")
            self.app = _too_many_connections
        else:
            self._slots.unclaimed(self, self._peer)  # waits for its first request's head
        self._arm_head_timer()

    def _make_room(self) -> bool:
        """Close the connection that gives way to this one (:mod:`hotseat_router.slots`);
        False when none does."""
        other = self._slots.give_way(self._peer)
        if other is None:
            return False
        log.debug("connection_closed", reason="making_room")
        other.transport.close()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._slots.closed(self, self._peer)
        self._disarm_head_timer()
        self._disarm_write_timer()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        super().connection_lost(exc)
        self._client_left.connection_lost()

    def linger(self) -> None:
        """Close after the answer, lingering (module docstring)."""
        transport = self.transport
        if self.lingering or transport.is_closing():
            return
        self.lingering = True
        self._disarm_head_timer()
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()  # sent once the answer before it is
        transport.resume_reading()
        self._linger_timer = self.loop.call_later(LINGER_S, transport.close)

    def on_headers_complete(self) -> None:
        self._slots.claimed(self, self._peer)
        self._in_head = False
        self._disarm_head_timer()
        super().on_headers_complete()
        if self.cycle is not None:
            self.cycle.transport = _Lingering(self.transport, self)  # type: ignore[assignment]

    def on_response_complete(self) -> None:
        self._client_left.response_complete()
        if self.lingering:
            return  # the connection is closing: no next request on it
        super().on_response_complete()
        if self.timeout_keep_alive_task is not None and not self.transport.is_closing():
            self._slots.unclaimed(self, self._peer)  # kept alive: waits for the next head

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(
                self._limits.write_timeout, self._client_stopped_reading
            )

    def resume_writing(self) -> None:
        self._disarm_write_timer()
        super().resume_writing()

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return  # what the client still sends after the answer is thrown away
        self._unset_keepalive_if_required()
        self._began_in_this_read = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _HeadRefused):
                self._refuse(HeadersTooLarge(str(exc.__context__)))
                return
            self._refuse(InvalidRequest("the request is not valid HTTP/1.1"))
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError:
            self._refuse(InvalidRequest("the request is not valid HTTP/1.1"))
            return
        if self._in_head and not self._began_in_this_read:
            # The whole read belongs to the unfinished head.
            self._read_head_bytes += len(data)
            if self._head_too_large():
                self._refuse(HeadersTooLarge(self._too_large()))

    def send_400_response(self, msg: str) -> None:
        self._refuse(InvalidRequest(msg))

    def _unsupported_upgrade_warning(self) -> None:
        # The router upgrades to nothing (no WebSocket, no h2c): the request is answered
        # as HTTP/1.1. uvicorn would log a warning per such request, which any client
        # could repeat at will.
        log.debug("upgrade_ignored")

    # parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        extensions = self.scope.get("extensions")
        if extensions is None:
            self.scope["extensions"] = self._extensions
        else:
            extensions[CLIENT_LEFT] = self._hook
        self._in_head = True
        self._began_in_this_read = True
        self._read_head_bytes = self._parsed_head_bytes = self._headers = 0
        if self._head_timer is None:
            self._arm_head_timer()

    def on_url(self, url: bytes) -> None:
        self._parsed_head_bytes += len(url)
        if self._head_too_large():
            raise _HeadRefused(self._too_large())
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._parsed_head_bytes += len(name) + len(value) + 4  # ": " and CRLF
        self._headers += 1
        if self._headers > self._limits.max_headers:
            raise _HeadRefused(f"a request may have at most {self._limits.max_headers} headers")
        if self._head_too_large():
            raise _HeadRefused(self._too_large())
        super().on_header(name, value)

    # limits

    def _head_too_large(self) -> bool:
        return max(self._read_head_bytes, self._parsed_head_bytes) > self._limits.max_header_bytes

    def _too_large(self) -> str:
        return f"request headers are larger than {self._limits.max_header_bytes} bytes"

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self._limits.header_timeout, self._head_late)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        self._refuse(
            ReadTimeout(f"request headers not received within {self._limits.header_timeout:g}s")
        )

    def _disarm_write_timer(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _client_stopped_reading(self) -> None:
        self._write_timer = None
        log.info("client_dropped", reason="write_timeout", timeout_s=self._limits.write_timeout)
        # Not close(): it would wait for the unread bytes to drain, which never happens.
        self.transport.abort()

    def _refuse(self, exc: HotseatError) -> None:
        """Answer ``exc`` and close, unless a response is already being written on this
        connection (a pipelined request): then just close once it is done."""
        self._disarm_head_timer()
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False
            self.flow.pause_reading()
            return
        raw, request_id = _answer(exc)
        log.debug("request_refused", code=exc.code, request_id=request_id.decode())
        self.transport.write(raw)
        self.linger()
