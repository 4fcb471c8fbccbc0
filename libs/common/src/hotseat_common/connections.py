"""Connecting to NATS and Redis with explicit timeouts, credentials and TLS from settings."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from nats.aio.client import Client as NatsClient
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from hotseat_common.logging import get_logger
from hotseat_common.settings import RedisSettings, ServiceSettings

log = get_logger(__name__)

NATS_CONNECT_TIMEOUT = 2.0
NATS_DRAIN_TIMEOUT = 10
REDIS_SOCKET_TIMEOUT = 2.0

ErrorCallback = Callable[[Exception], Awaitable[None]]


async def open_nats(servers: str | list[str], **options: Any) -> NatsClient:
    """``nats.connect(servers, **options)``, whose reconnect attempts leave no socket behind.

    nats-py (2.16) keeps the socket of a reconnect attempt whose handshake failed (the
    server end closed it before NATS's greeting, or it came too late) and opens the next
    attempt beside it: each stays open until the garbage collector finds it, one per
    attempt through an outage. The failed attempt is reported to ``error_cb`` before the
    next starts, so that is where its socket is closed. The services and the tests connect
    through here. With no ``error_cb`` of the caller's, failures are not logged (nats-py's
    own callback would log each at ERROR).
    """
    client = NatsClient()
    error_cb: ErrorCallback | None = options.pop("error_cb", None)

    async def on_error(exc: Exception) -> None:
        if client.is_reconnecting or client.is_connecting:
            _close_attempt(client)
        if error_cb is not None:
            await error_cb(exc)

    await client.connect(servers, error_cb=on_error, **options)
    return client


def _close_attempt(client: NatsClient) -> None:
    """Close the socket of the connection attempt that just failed (a no-op when it is
    closed already, or when the attempt failed before it had one).

    nats-py gives no public handle on it. Should a release rename the attribute, this does
    nothing rather than raise: an exception here would end nats-py's reconnect loop, and
    ``tests/common/test_connections.py`` would show the leak back."""
    transport = getattr(client, "_transport", None)
    if transport is not None:
        transport.close()


async def connect_nats(settings: ServiceSettings, name: str) -> NatsClient:
    """Connect and keep reconnecting forever; state changes are logged, never silent."""

    async def on_error(exc: Exception) -> None:
        log.warning("nats_error", error=str(exc) or type(exc).__name__)

    async def on_disconnected() -> None:
        log.warning("nats_disconnected")

    async def on_reconnected() -> None:
        log.info(
            "nats_reconnected",
            url=str(client.connected_url.geturl()) if client.connected_url else None,
        )

    servers = [u.strip() for u in settings.nats_url.split(",") if u.strip()]
    options: dict[str, Any] = {
        "name": name,
        "connect_timeout": NATS_CONNECT_TIMEOUT,
        "reconnect_time_wait": 0.5,
        "max_reconnect_attempts": -1,
        "drain_timeout": NATS_DRAIN_TIMEOUT,
        "error_cb": on_error,
        "disconnected_cb": on_disconnected,
        "reconnected_cb": on_reconnected,
        "allow_reconnect": True,
    }
    if settings.nats_user:
        options["user"] = settings.nats_user
    if settings.nats_password:
        options["password"] = settings.nats_password.get_secret_value()
    if settings.nats_token:
        options["token"] = settings.nats_token.get_secret_value()
    if settings.nats_creds:
        options["user_credentials"] = str(settings.nats_creds)
    if settings.nats_tls_ca:
        options["tls"] = ssl.create_default_context(cafile=str(settings.nats_tls_ca))
    client = await open_nats(servers, **options)
    return client


def connect_redis(settings: RedisSettings, *, reconnect_retries: int = 0) -> aioredis.Redis:
    """A pooled client; every command times out rather than hanging on a stalled server.

    ``reconnect_retries``: how often a command that met a broken connection (a pooled
    connection to a Redis that restarted) is sent again on a fresh one, at once. Only for
    callers whose commands are safe to repeat; a timeout is never retried.
    """
    options: dict[str, Any] = {
        "socket_timeout": REDIS_SOCKET_TIMEOUT,
        "socket_connect_timeout": REDIS_SOCKET_TIMEOUT,
        "health_check_interval": 10,
        "decode_responses": True,
    }
    if reconnect_retries > 0:
        options["retry"] = Retry(
            NoBackoff(), reconnect_retries, supported_errors=(RedisConnectionError,)
        )
    if settings.redis_password:
        options["password"] = settings.redis_password.get_secret_value()
    if settings.redis_tls_ca:
        options["ssl_ca_certs"] = str(settings.redis_tls_ca)
    client: aioredis.Redis = aioredis.from_url(settings.redis_url, **options)
    return client
