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
from collections.abc import Coroutine
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from hotseat_common.logging import get_logger
from hotseat_pool_controller.store.link import RedisLink

log = get_logger(__name__)

T = TypeVar("T")


class StoreDown(RedisConnectionError):
    """The pool store did not answer its last probe."""


class StoreHealth:
    def __init__(self, link: RedisLink, *, interval: float, timeout: float) -> None:
        self._link = link
        self._interval = interval
        self._timeout = timeout
        self._up = True
        self._guarded: set[asyncio.Task[Any]] = set()
        self._cut: set[asyncio.Task[Any]] = set()

    @property
    def up(self) -> bool:
        return self._up

    async def run(self) -> None:
        """Probe forever (a background loop of the controller)."""
        while True:
            try:
                async with asyncio.timeout(self._timeout):
                    # The same pipelined connection the requests use: a probe measures
                    # their path, queued behind whatever they are waiting for.
                    await self._link.execute("PING")
            except (RedisError, TimeoutError, OSError) as exc:
                if self._up:
                    log.warning("store_down", error=str(exc) or type(exc).__name__)
                self._mark_down()
            else:
                if not self._up:
                    log.info("store_up")
                self._up = True
            await asyncio.sleep(self._interval)

    def _mark_down(self) -> None:
        """Down: every request still waiting on the store is cut loose now."""
        self._up = False
        for task in self._guarded - self._cut:
            self._cut.add(task)
            task.cancel()

    async def guard(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` in the calling task; raise :class:`StoreDown` at once if the store
        is down, or as soon as a probe finds it down while ``work`` waits on it (the probe
        cancels the task, as :func:`asyncio.timeout` does, and the cancel becomes
        ``StoreDown`` here; a cancel from anyone else stays a cancel)."""
        if not self._up:
            work.close()
            raise StoreDown("pool state store unreachable")
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - always called from a task
            return await work
        self._guarded.add(task)
        try:
            return await work
        except asyncio.CancelledError:
            if task in self._cut and task.uncancel() == 0:
                raise StoreDown("pool state store stopped answering") from None
            raise
        finally:
            self._guarded.discard(task)
            self._cut.discard(task)
