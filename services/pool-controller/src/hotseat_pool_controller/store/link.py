"""The controller's connection to the pool store: one socket, commands pipelined.

Every pooled request costs the controller two script calls (grant, release). redis-py
checks a connection out of its pool, sends, waits for the reply and checks the
connection back in for each command; measured here, 120-170 µs of CPU per call, the
largest single cost of an acquire. This link writes commands on one connection without
waiting for earlier replies and matches replies in order (Redis answers a connection's
commands in the order they came), with hiredis parsing: 15-65 µs per call. Commands
issued in the same event-loop iteration leave in one write, so concurrent requests share
syscalls.
docs/adr/0004-activation-hot-path.md has the measurements and the alternatives tried.

Failures, as the store's callers expect them (redis-py's exception types):

- an error reply raises :class:`~redis.exceptions.ResponseError`; a script the server no
  longer knows (it restarted) is sent again in full with ``EVAL``;
- a connection that breaks fails every command waiting on it with
  :class:`~redis.exceptions.ConnectionError`; the next command opens a new connection,
  and a command that met a broken connection is sent again up to ``retries`` times (the
  store's scripts are all safe to repeat);
- a command unanswered for ``timeout`` seconds fails with
  :class:`~redis.exceptions.TimeoutError`, as does every command behind it, and the
  connection is dropped (a stalled server); the next command reconnects.

With ``redis_sentinels`` set, each connection first asks the Sentinels where the primary
is, and checks with ``ROLE`` that the server it reached is a primary; a ``READONLY`` reply
(the server was demoted under it) drops the connection like a broken one, so the next
command finds the new primary.

Each connection learns the ``run_id`` of the server it reached (``INFO server``, before
any other command): a script called with ``identified=True`` gets it as its last
argument, read at the moment the command leaves, so a script can tell that the server it
runs on is not the one that wrote the state it finds (a restart or a failover, which may
have lost writes; docs/adr/0005).

Every script call ends with the store's clock (scripts.NOW): empty in service, so each
script reads Redis ``TIME`` (one clock for every replica, no round trip); a link given a
``clock`` (a test's virtual milliseconds) sends its time instead.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import hiredis
from redis.asyncio.connection import parse_url
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from hotseat_common.settings import RedisSettings

Arg = str | int | float | bytes

DEFAULT_TIMEOUT_S = 2.0
"""The same bound the services put on every redis-py command."""


@dataclass(frozen=True, slots=True)
class LuaScript:
    """A script known by its SHA1 so calls send the digest, not the source."""

    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())  # noqa: S324 - Redis names scripts by SHA1


@dataclass(frozen=True, slots=True)
class _Endpoint:
    host: str
    port: int
    path: str | None
    tls: ssl.SSLContext | None
    username: str | None
    password: str | None
    db: int

    @classmethod
    def from_settings(cls, settings: RedisSettings) -> _Endpoint:
        parts = parse_url(settings.redis_url)
        tls = None
        if settings.redis_url.startswith("rediss://"):
            cafile = str(settings.redis_tls_ca) if settings.redis_tls_ca else None
            tls = ssl.create_default_context(cafile=cafile)
        password = (
            settings.redis_password.get_secret_value()
            if settings.redis_password
            else parts.get("password")
        )
        return cls(
            host=str(parts.get("host") or "127.0.0.1"),
            port=int(parts.get("port") or 6379),
            path=parts.get("path"),
            tls=tls,
            username=parts.get("username"),
            password=password,
            db=int(parts.get("db") or 0),
        )


class _Connection(asyncio.Protocol):
    """One socket: futures queued in send order, resolved in reply order."""

    def __init__(self) -> None:
        self._reader = hiredis.Reader(encoding="utf-8", replyError=ResponseError)
        self._pending: collections.deque[tuple[asyncio.Future[Any], float]] = collections.deque()
        self._transport: asyncio.Transport | None = None
        self._outbox: list[bytes] = []
        self.closed = False
        self.server_id = ""
        """The ``run_id`` of the server this connection reached ("" when it will not say)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast("asyncio.Transport", transport)  # a stream socket

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        try:
            while (reply := self._reader.gets()) is not False:
                future, _ = self._pending.popleft()
                if isinstance(reply, ResponseError) and str(reply).startswith("READONLY"):
                    # Demoted to a replica under us (a failover): as good as broken.
                    self.abort(RedisConnectionError(f"Redis is no longer the primary: {reply}"))
                    return
                if future.done():  # its caller gave up (a probe's own timeout)
                    continue
                if isinstance(reply, ResponseError):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)
        except (hiredis.ProtocolError, IndexError) as exc:
            self.abort(RedisConnectionError(f"unreadable reply from Redis: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(RedisConnectionError(f"connection to Redis lost: {exc or 'closed'}"))

    def send(self, args: Sequence[Arg]) -> asyncio.Future[Any]:
        if self.closed or self._transport is None:
            raise RedisConnectionError("connection to Redis closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((future, time.monotonic()))
        if not self._outbox:
            loop.call_soon(self._flush)
        self._outbox.append(hiredis.pack_command(tuple(args)))  # type: ignore[arg-type]
        return future

    def _flush(self) -> None:
        """Commands issued in the same loop iteration leave in one write (one syscall)."""
        if self._transport is not None and not self.closed:
            self._transport.write(b"".join(self._outbox))
        self._outbox.clear()

    def oldest_sent(self) -> float | None:
        return self._pending[0][1] if self._pending else None

    def abort(self, exc: Exception) -> None:
        self._fail_all(exc)
        if self._transport is not None:
            self._transport.abort()

    def _fail_all(self, exc: Exception) -> None:
        self.closed = True
        while self._pending:
            future, _ = self._pending.popleft()
            if not future.done():
                future.set_exception(exc)


class RedisLink:
    """A pipelined connection to Redis, opened on first use and reopened after a failure."""

    def __init__(
        self,
        settings: RedisSettings,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        retries: int = 0,
        name: str | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self._endpoint = _Endpoint.from_settings(settings)
        self._sentinel = _sentinel(settings, timeout)
        self._master = settings.redis_sentinel_master
        self._timeout = timeout
        self._retries = retries
        self._name = name
        self._clock = clock
        self._conn: _Connection | None = None
        self._opening: asyncio.Task[_Connection] | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._closed = False

    async def execute(self, *args: Arg, identified: bool = False, timed: bool = False) -> Any:
        """Send one command and return its reply (strings decoded as UTF-8); ``identified``
        appends the ``run_id`` of the server the command is sent to, then ``timed`` the
        store's clock ("" for Redis ``TIME``)."""
        attempt = 0
        while True:
            conn = self._conn
            if conn is None or conn.closed:
                conn = await self._open()
            sent = (*args, conn.server_id) if identified else args
            if timed:
                sent = (*sent, "" if self._clock is None else self._clock())
            try:
                return await conn.send(sent)
            except RedisConnectionError:
                attempt += 1
                if attempt > self._retries:
                    raise

    @property
    def server_id(self) -> str:
        """The ``run_id`` of the server the open connection reached ("" when none)."""
        return self._conn.server_id if self._conn is not None else ""

    async def script(
        self,
        script: LuaScript,
        keys: Sequence[Arg],
        args: Sequence[Arg],
        *,
        identified: bool = False,
    ) -> Any:
        """Run a script by digest; by source when the server does not know it. Its last
        argument is the store's clock (scripts.NOW)."""
        try:
            return await self.execute(
                "EVALSHA", script.sha, len(keys), *keys, *args, identified=identified, timed=True
            )
        except ResponseError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
        return await self.execute(
            "EVAL", script.source, len(keys), *keys, *args, identified=identified, timed=True
        )

    async def aclose(self) -> None:
        self._closed = True
        if self._sentinel is not None:
            for client in self._sentinel.sentinels:
                await client.aclose()
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._opening is not None:
            self._opening.cancel()
        if self._conn is not None:
            self._conn.abort(RedisConnectionError("link closed"))
            self._conn = None

    # --- connecting -------------------------------------------------------------------

    async def _open(self) -> _Connection:
        if self._closed:
            raise RedisConnectionError("link closed")
        if self._opening is None:
            self._opening = asyncio.create_task(self._connect())
        return await asyncio.shield(self._opening)

    async def _connect(self) -> _Connection:
        """Open, authenticate and select the database; one attempt shared by all callers."""
        loop = asyncio.get_running_loop()
        ep = self._endpoint
        conn: _Connection | None = None
        try:
            async with asyncio.timeout(self._timeout):
                if self._sentinel is not None:
                    host, port = await self._sentinel.discover_master(self._master)
                    ep = dataclasses.replace(ep, host=str(host), port=int(port), path=None)
                if ep.path is not None:
                    _, conn = await loop.create_unix_connection(_Connection, ep.path)
                else:
                    _, conn = await loop.create_connection(
                        _Connection,
                        ep.host,
                        ep.port,
                        ssl=ep.tls,
                        server_hostname=ep.host if ep.tls else None,
                    )
                for command in self._handshake():
                    await conn.send(command)
                if self._sentinel is not None:
                    await _require_primary(conn)
                conn.server_id = await _server_id(conn)
        except BaseException as exc:
            if conn is not None:
                conn.abort(RedisConnectionError("connection setup failed"))
            error = _connect_error(exc, self._timeout)
            if error is exc:
                raise
            raise error from exc
        finally:
            self._opening = None
        self._conn = conn
        self._arm_watchdog()
        return conn

    def _handshake(self) -> list[tuple[Arg, ...]]:
        ep = self._endpoint
        commands: list[tuple[Arg, ...]] = []
        if ep.password is not None:
            commands.append(
                ("AUTH", ep.username, ep.password) if ep.username else ("AUTH", ep.password)
            )
        if ep.db:
            commands.append(("SELECT", ep.db))
        if self._name:
            commands.append(("CLIENT", "SETNAME", self._name))
        return commands

    def _arm_watchdog(self) -> None:
        if self._watchdog is None and not self._closed:
            loop = asyncio.get_running_loop()
            self._watchdog = loop.call_later(self._timeout / 4, self._check_stall)

    def _check_stall(self) -> None:
        """Replies come in order, so only the oldest command can be overdue first."""
        self._watchdog = None
        conn = self._conn
        if conn is None or conn.closed:
            return
        sent = conn.oldest_sent()
        if sent is not None and time.monotonic() - sent > self._timeout:
            conn.abort(RedisTimeoutError(f"Redis did not answer within {self._timeout}s"))
            self._conn = None
            return
        self._arm_watchdog()


def _sentinel(settings: RedisSettings, timeout: float) -> Sentinel | None:
    if not settings.redis_sentinels:
        return None
    addresses: list[tuple[str, int]] = []
    for item in settings.redis_sentinels.split(","):
        host, _, port = item.strip().rpartition(":")
        addresses.append((host or "127.0.0.1", int(port or 26379)))
    password = settings.redis_sentinel_password
    # Through Any: Sentinel has annotations from redis-py 8 on, none before (a call of an
    # unannotated class is an error under strict typing, an ignore unused by 8 is one too).
    factory: Any = Sentinel
    sentinel: Sentinel = factory(
        addresses,
        sentinel_kwargs={
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "password": password.get_secret_value() if password else None,
        },
    )
    return sentinel


async def _require_primary(conn: _Connection) -> None:
    """A Sentinel's answer may be stale for a moment after a failover: refuse a replica."""
    role = await conn.send(("ROLE",))
    if not role or role[0] != "master":
        raise RedisConnectionError(f"the server the Sentinels named is a {role[0]}, not primary")


async def _server_id(conn: _Connection) -> str:
    """``run_id`` from ``INFO server`` ("" where INFO is renamed or refused, e.g. a proxy)."""
    try:
        info = await conn.send(("INFO", "server"))
    except ResponseError:
        return ""
    for line in str(info).splitlines():
        if line.startswith("run_id:"):
            return line.partition(":")[2].strip()
    return ""


def _connect_error(exc: BaseException, timeout: float) -> BaseException:
    """redis-py's exception for a failed connection attempt (others pass through)."""
    if isinstance(exc, TimeoutError):
        return RedisTimeoutError(f"connecting to Redis took over {timeout}s")
    if isinstance(exc, ResponseError):
        return AuthenticationError(f"Redis refused the connection: {exc}")
    if isinstance(exc, OSError):
        return RedisConnectionError(f"cannot connect to Redis: {exc}")
    if isinstance(exc, RedisError) and not isinstance(exc, RedisConnectionError):
        return RedisConnectionError(f"cannot find the Redis primary: {exc}")
    return exc
