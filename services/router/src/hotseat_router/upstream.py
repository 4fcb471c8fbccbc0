"""The upstream HTTP client: pooled keep-alive HTTP/1.1 connections to every backend.

Each connection is an asyncio protocol around httptools' response parser (the parser
uvicorn already uses for the router's clients); the pool keeps idle connections per
origin (scheme, host, port), opens at most ``connections_per_host`` at once per origin
and closes one left idle longer than ``keepalive_s``. It replaced aiohttp by measurement
(docs/adr/0003-router-upstream-client.md): the router sends one kind of request, a POST
with a body it already holds, and relays the answer's bytes untouched, so a general
client's machinery (cookies, redirects, decompression, a stream reader per response)
was most of its cost.

Every failure is translated here, at this one boundary, into :class:`UpstreamConnectError`
(nothing of an answer came) or :class:`UpstreamBodyError` (the body broke off); timeouts
are the caller's (``asyncio.timeout`` around :meth:`UpstreamClient.send` and each
:meth:`UpstreamResponse.chunk`).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections import deque
from typing import NamedTuple
from urllib.parse import unquote

import httptools

Body = bytes | tuple[bytes | memoryview, ...]
"""A request body: its bytes, or pieces sent one after the other (a renamed body)."""

WRITE_SLICE = 256 * 1024
"""A body larger than this is written a slice at a time, each once the connection's send
buffer has drained: it then holds at most about a slice, never a copy of the whole body."""

READ_HIGH_WATER = 256 * 1024
"""Reading from an upstream pauses while this much of its body waits to be relayed (a
client that reads slowly must not make the router buffer a whole answer)."""

MAX_HEAD_BYTES = 256 * 1024
"""An upstream whose response head is longer than this is treated as unreachable."""

_DEFAULT_PORTS = {"http": 80, "https": 443}


class UpstreamConnectError(Exception):
    """The upstream could not be reached or dropped the connection before answering."""


class UpstreamBodyError(Exception):
    """The upstream broke the connection while sending its body."""


class _AfterTheAnswer(Exception):
    """Raised from a parser callback: an upstream began another answer after its answer."""


class _Origin(NamedTuple):
    scheme: str
    host: str
    port: int
    host_header: bytes
    basic_auth: str | None
    """``Basic ...`` from the address's ``user:password@``, sent when the request has no
    ``authorization`` of its own (a backend's ``credentialsEnv`` bearer)."""


def _split(url: str) -> tuple[str, str]:
    """``http://host:port/a/b?q`` as (``http://host:port``, ``/a/b?q``)."""
    start = url.find("://")
    if start < 0:
        raise UpstreamConnectError(f"not an absolute URL: {url!r}")
    slash = url.find("/", start + 3)
    if slash < 0:
        return url, "/"
    return url[:slash], url[slash:]


def _origin(origin: str) -> _Origin:
    scheme, _, authority = origin.partition("://")
    scheme = scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise UpstreamConnectError(f"unsupported scheme {scheme!r}")
    userinfo, at, authority = authority.rpartition("@")
    basic_auth = None
    if at:
        user, _, password = userinfo.partition(":")
        pair = f"{unquote(user)}:{unquote(password)}".encode()
        basic_auth = "Basic " + base64.b64encode(pair).decode("ascii")
    if authority.startswith("["):  # [IPv6]:port
        host, _, rest = authority[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = authority.partition(":")
    try:
        port = int(port_text) if port_text else _DEFAULT_PORTS[scheme]
    except ValueError:
        raise UpstreamConnectError(f"invalid port in {origin!r}") from None
    host_header = authority.encode("idna" if not authority.isascii() else "ascii")
    return _Origin(scheme, host, port, host_header, basic_auth)


class _Connection(asyncio.Protocol):
    """One keep-alive connection: a request written, its answer parsed as it arrives."""

    def __init__(self, pool: _Pool) -> None:
        self._pool = pool
        self._parser = httptools.HttpResponseParser(self)
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.reused = False
        self.idle_since = 0.0
        self.busy = False
        self.closed = False
        self.keep_alive = False
        # The exchange in progress:
        self.head: asyncio.Future[None] | None = None
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body_ended = False
        self.error: str | None = None
        self._head_done = False
        self._head_bytes = 0
        self._interim = False
        self._until_close = False
        self._began_another = False
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._reading_paused = False
        self._data: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None

    # --- the exchange --------------------------------------------------------------------

    @property
    def complete(self) -> bool:
        """The answer's body was received in full and taken."""
        return self.body_ended and self.error is None and not self._chunks

    @property
    def nothing_came(self) -> bool:
        """No byte of an answer arrived (a pooled connection the upstream had closed)."""
        return self._head_bytes == 0

    def begin(self) -> asyncio.Future[None]:
        """Ready the connection for one request; the future is done at the answer's head."""
        self.busy = True
        self.head = self._loop.create_future()
        self.status = 0
        self.headers = []
        self.body_ended = False
        self.error = None
        self._head_done = False
        self._head_bytes = 0
        self._interim = False
        self._until_close = False
        self._began_another = False
        self._chunks.clear()  # an answer given back unread but whole left its body here
        self._buffered = 0
        return self.head

    def take(self) -> bytes:
        """The body received so far (``b""`` when none waits)."""
        chunks = self._chunks
        if not chunks:
            return b""
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._reading_paused and not self.closed:
            self._reading_paused = False
            assert self.transport is not None  # noqa: S101 - set once connected
            self.transport.resume_reading()
        return data

    async def more(self) -> None:
        """Wait until body bytes arrive, the body ends or the connection breaks."""
        self._data = self._loop.create_future()
        try:
            await self._data
        finally:
            self._data = None

    async def drain(self) -> None:
        if self._drained is not None:
            await self._drained

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()

    # --- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self.busy or self.body_ended:
            self._overrun()
            return
        if not self._head_done:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._broken("response head too large")
                return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self._began_another:
                self._overrun()
            else:
                self._broken(f"invalid HTTP response: {exc}")

    def pause_writing(self) -> None:
        self._drained = self._loop.create_future()

    def resume_writing(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.lost(self)
        if self.busy:
            if self._head_done and not self.body_ended:
                if self._until_close and exc is None:
                    self.body_ended = True
                else:
                    self.error = self.error or "the upstream closed the connection mid-body"
            elif not self._head_done:
                self.error = self.error or (str(exc) if exc else "server disconnected")
        self.resume_writing()
        self._wake()

    # --- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.body_ended:
            self._began_another = True
            raise _AfterTheAnswer  # stops the parser: nothing of it joins the answer

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:  # an interim answer (100 Continue): the real one follows
            self._interim = True
            self.headers = []
            return
        self.status = status
        self._head_done = True
        self._until_close = not self._parser.should_keep_alive() and not any(
            name.lower() in (b"content-length", b"transfer-encoding") for name, _ in self.headers
        )
        head = self.head
        if head is not None and not head.done():
            head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > READ_HIGH_WATER and not self._reading_paused:
            self._reading_paused = True
            assert self.transport is not None  # noqa: S101 - set once connected
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self.body_ended = True
        self.keep_alive = self._parser.should_keep_alive()
        self._wake()

    # --- internals -----------------------------------------------------------------------

    def _overrun(self) -> None:
        """Bytes nobody asked for (more after the answer's end): the answer received stays
        whole, but the connection has lost track of the exchange and is not reused."""
        self.keep_alive = False
        self.close()

    def _broken(self, why: str) -> None:
        self.error = self.error or why
        self.close()
        self._wake()

    def _wake(self) -> None:
        head = self.head
        if head is not None and not head.done() and self.error is not None:
            head.set_result(None)
        data = self._data
        if data is not None and not data.done():
            data.set_result(None)


class _Pool:
    """The connections to one origin: idle ones reused newest first, at most ``limit``
    open at once (a request beyond waits for one), none idle longer than ``keepalive_s``."""

    def __init__(
        self, origin: _Origin, *, limit: int, keepalive_s: float, tls: ssl.SSLContext | None
    ) -> None:
        self.origin = origin
        self._limit = limit
        self._keepalive = keepalive_s
        self._tls = tls
        self._idle: deque[_Connection] = deque()
        self._open: set[_Connection] = set()
        self._waiters: deque[asyncio.Future[_Connection | None]] = deque()
        self._expiry: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()

    async def acquire(self) -> _Connection:
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                conn.reused = True
                return conn
        while len(self._open) >= self._limit:
            waiter: asyncio.Future[_Connection | None] = self._loop.create_future()
            self._waiters.append(waiter)
            try:
                handed = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    given = waiter.result()
                    if given is not None:
                        self.release(given)
                else:
                    self._waiters.remove(waiter)
                raise
            if handed is not None:
                handed.reused = True
                return handed
        return await self._connect()

    async def _connect(self) -> _Connection:
        origin = self.origin
        conn = _Connection(self)
        self._open.add(conn)
        try:
            await self._loop.create_connection(
                lambda: conn,
                origin.host,
                origin.port,
                ssl=self._tls,
                server_hostname=origin.host if self._tls is not None else None,
            )
        except BaseException:
            self._open.discard(conn)
            self._hand_over(None)
            raise
        return conn

    def release(self, conn: _Connection) -> None:
        """Back to the pool once its answer was read in full, else closed."""
        conn.busy = False
        conn.head = None
        if conn.closed or not conn.body_ended or not conn.keep_alive:
            conn.close()
            return
        if self._hand_over(conn):
            return
        conn.idle_since = self._loop.time()
        self._idle.append(conn)
        if self._expiry is None:
            self._expiry = self._loop.call_at(conn.idle_since + self._keepalive, self._expire)

    def lost(self, conn: _Connection) -> None:
        if conn in self._open:
            self._open.discard(conn)
            with_idle = self._idle
            if conn in with_idle:
                with_idle.remove(conn)
            self._hand_over(None)

    def _hand_over(self, conn: _Connection | None) -> bool:
        """Give ``conn`` (or, with ``None``, the room a closed one left) to the first
        request waiting for this origin."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                if conn is not None:
                    conn.busy = True
                waiter.set_result(conn)
                return True
        return False

    def _expire(self) -> None:
        self._expiry = None
        now = self._loop.time()
        idle = self._idle
        while idle and now - idle[0].idle_since >= self._keepalive:
            idle.popleft().close()
        if idle:
            self._expiry = self._loop.call_at(idle[0].idle_since + self._keepalive, self._expire)

    def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        for conn in list(self._open):
            conn.close()
        self._idle.clear()


class UpstreamResponse:
    """Status and headers of an upstream answer whose body is read chunk by chunk."""

    __slots__ = ("_conn", "_pool", "_returned", "headers", "status")

    def __init__(self, conn: _Connection, pool: _Pool) -> None:
        self._conn = conn
        self._pool = pool
        self._returned = False
        self.status = conn.status
        self.headers: tuple[tuple[bytes, bytes], ...] = tuple(conn.headers)

    @property
    def content_type(self) -> str:
        """The media type, lowercase, without parameters (``application/octet-stream``
        when the upstream named none)."""
        for name, value in self.headers:
            if name.lower() == b"content-type":
                media = value.partition(b";")[0].strip().lower()
                return media.decode("latin-1") or "application/octet-stream"
        return "application/octet-stream"

    @property
    def body_known_complete(self) -> bool:
        """True once the body has been received in full and nothing of it waits."""
        return self._conn.complete

    async def chunk(self) -> bytes:
        """The next piece of the body as it arrives; ``b""`` at its end."""
        while True:
            data = self.chunk_at_hand()
            if data is not None:
                return data
            await self._conn.more()

    def chunk_at_hand(self) -> bytes | None:
        """What :meth:`chunk` would return at once, without waiting: the body received so
        far (``b""`` at its end); ``None`` when nothing came yet (then await :meth:`chunk`)."""
        conn = self._conn
        data = conn.take()
        if data:
            return data
        if conn.error is not None:
            raise UpstreamBodyError(conn.error)
        return b"" if conn.body_ended else None

    def close(self) -> None:
        """Return the connection to the pool when the body was read, else drop it
        (closing the socket is what tells the upstream to stop generating). A second
        call does nothing: the connection may already serve another request."""
        if not self._returned:
            self._returned = True
            self._pool.release(self._conn)


class UpstreamClient:
    """One connection pool per origin, shared by every backend of the router process."""

    def __init__(self, *, connections_per_host: int, keepalive_s: float) -> None:
        self._limit = connections_per_host
        self._keepalive = keepalive_s
        self._pools: dict[str, _Pool] = {}
        self._tls: ssl.SSLContext | None = None

    def _pool(self, origin: str) -> _Pool:
        pool = self._pools.get(origin)
        if pool is None:
            parsed = _origin(origin)
            tls = None
            if parsed.scheme == "https":
                if self._tls is None:
                    self._tls = ssl.create_default_context()
                tls = self._tls
            pool = self._pools[origin] = _Pool(
                parsed, limit=self._limit, keepalive_s=self._keepalive, tls=tls
            )
        return pool

    async def send(
        self, url: str, *, headers: list[tuple[str, str]], body: Body
    ) -> UpstreamResponse:
        """POST ``body`` to ``url`` as it is written (the client's query string, already
        percent-encoded, is not encoded a second time) and return once the response
        headers arrived."""
        origin, target = _split(url)
        pool = self._pool(origin)
        basic_auth = pool.origin.basic_auth
        if basic_auth is not None and not any(n.lower() == "authorization" for n, _ in headers):
            headers = [*headers, ("authorization", basic_auth)]
        head = _head(target, pool.origin.host_header, headers, _length(body))
        # A pooled connection the upstream closed while idle fails before any byte of an
        # answer; one retry on another connection is not a second attempt.
        retried = False
        while True:
            try:
                conn = await pool.acquire()
            except OSError as exc:
                raise UpstreamConnectError(str(exc) or type(exc).__name__) from exc
            try:
                answered = conn.begin()
                await _write(conn, head, body)
                await answered
            except BaseException:
                conn.close()
                pool.release(conn)
                raise
            if conn.error is None:
                return UpstreamResponse(conn, pool)
            pool.release(conn)
            if retried or not (conn.reused and conn.nothing_came):
                raise UpstreamConnectError(conn.error)
            retried = True  # at most once: a request that kills its upstream is not repeated

    async def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


def _length(body: Body) -> int:
    if isinstance(body, bytes):
        return len(body)
    return sum(len(piece) for piece in body)


def _head(target: str, host: bytes, headers: list[tuple[str, str]], length: int) -> bytes:
    lines = "".join([f"{name}: {value}\r\n" for name, value in headers])
    if lines.count("\n") != len(headers) or lines.count("\r") != len(headers):
        raise UpstreamConnectError("a header holds a line break")
    try:
        request_target = target.encode("ascii")
    except UnicodeEncodeError:
        raise UpstreamConnectError("the upstream URL is not ASCII") from None
    return b"POST %s HTTP/1.1\r\nhost: %s\r\n%scontent-length: %d\r\n\r\n" % (
        request_target,
        host,
        lines.encode("utf-8"),
        length,
    )


async def _write(conn: _Connection, head: bytes, body: Body) -> None:
    transport = conn.transport
    assert transport is not None  # noqa: S101 - set once connected
    if isinstance(body, bytes) and len(body) <= WRITE_SLICE:
        transport.write(head + body)
        return
    pieces = (body,) if isinstance(body, bytes) else body
    if sum(len(piece) for piece in pieces) <= WRITE_SLICE:
        transport.write(head + b"".join(pieces))
        return
    transport.write(head)
    for piece in pieces:
        view = memoryview(piece)
        for start in range(0, len(view), WRITE_SLICE):
            if conn.closed:
                return  # the answer (or the error) says why
            transport.write(view[start : start + WRITE_SLICE])
            await conn.drain()
