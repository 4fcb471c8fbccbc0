"""Whether the pool store (Redis) answers, known within one probe, so the controller fails
closed *fast* when it does not.

Without it, a blackholed Redis (packets dropped, nothing refused) makes every command hang
until the client's socket timeout, and the router, asking again while the controller is
silent, holds each pooled request for its whole swap budget. With it, a probe (``PING``
bounded by ``timeout``) runs every ``interval``; while the store is down every request is
answered ``controller_unavailable`` at once, and requests already waiting on the store
are answered the moment the probe fails (their store calls are abandoned: a write that
landed anyway is a lease or a waiter that nobody uses, and it expires by itself).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from hotseat_common.logging import get_logger

log = get_logger(__name__)

T = TypeVar("T")


class StoreDown(RedisConnectionError):
    """The pool store did not answer its last probe."""


class StoreHealth:
    def __init__(self, redis: aioredis.Redis, *, interval: float, timeout: float) -> None:
        self._redis = redis
        self._interval = interval
        self._timeout = timeout
        self._down = asyncio.Event()

    @property
    def up(self) -> bool:
        return not self._down.is_set()

    async def run(self) -> None:
        """Probe forever (a background loop of the controller)."""
        while True:
            try:
                async with asyncio.timeout(self._timeout):
                    await self._redis.ping()  # the client resends it once a broken link
            except (RedisError, TimeoutError, OSError) as exc:
                if self.up:
                    log.warning("store_down", error=str(exc) or type(exc).__name__)
                self._down.set()
            else:
                if not self.up:
                    log.info("store_up")
                self._down.clear()
            await asyncio.sleep(self._interval)

    async def guard(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work``; raise :class:`StoreDown` at once if the store is down, or as soon
        as a probe finds it down while ``work`` waits on it."""
        if not self.up:
            work.close()
            raise StoreDown("pool state store unreachable")
        task = asyncio.ensure_future(work)
        down = asyncio.ensure_future(self._down.wait())
        try:
            await asyncio.wait({task, down}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            down.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise StoreDown("pool state store stopped answering")
