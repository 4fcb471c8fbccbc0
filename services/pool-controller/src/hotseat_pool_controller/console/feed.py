"""The pools as a live feed: one reader for every watcher (``GET /v1/pool-updates``).

While anyone watches, one loop reads every pool's view when a pool announces a change
(the NATS pool events, from whichever replica made it), and at least every ``interval``
(leases and waiters change without an announcement, and a swap's elapsed time moves);
it hands a watcher the views only when they differ from what that watcher last got. A
hundred open consoles cost the store what one does; nobody watching costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable

from hotseat_common.logging import get_logger
from hotseat_common.messages import POOL_UPDATES_ERROR_EVENT, POOL_UPDATES_EVENT, PoolList

log = get_logger(__name__)

KEEPALIVE_S = 15.0
"""A quiet stream gets a comment line this often, so proxies keep it open."""


class _Watcher:
    """What one watcher has not taken yet: only the newest body counts."""

    def __init__(self) -> None:
        self.pending: tuple[str, str] | None = None
        self.ready = asyncio.Event()
        self.last: str | None = None

    def offer(self, event: str, body: str) -> None:
        if body == self.last:
            return
        self.pending = (event, body)
        self.ready.set()


class PoolFeed:
    def __init__(
        self,
        read: Callable[[], Awaitable[PoolList]],
        *,
        interval: float,
        keepalive: float = KEEPALIVE_S,
    ) -> None:
        self._read = read
        self._interval = interval
        self._keepalive = keepalive
        self._watchers: set[_Watcher] = set()
        self._wake = asyncio.Event()
        self._watched = asyncio.Event()
        self._closed = asyncio.Event()

    def changed(self) -> None:
        """A pool announced a change: read now."""
        self._wake.set()

    def close(self) -> None:
        """End every watch (the server shuts down: an open stream must not hold it)."""
        self._closed.set()
        for watcher in self._watchers:
            watcher.ready.set()

    @property
    def watchers(self) -> int:
        return len(self._watchers)

    async def run(self) -> None:
        """Until cancelled (it outlives :meth:`close`: the lifespan cancels it)."""
        while True:
            await self._watched.wait()
            self._wake.clear()
            try:
                event, body = POOL_UPDATES_EVENT, (await self._read()).model_dump_json()
            except Exception as exc:  # the store is down: say so, keep watching
                log.warning("pool_feed_read_failed", error=repr(exc))
                event = POOL_UPDATES_ERROR_EVENT
                body = json.dumps({"error": str(exc) or type(exc).__name__})
            for watcher in self._watchers:
                watcher.offer(event, body)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval)

    async def watch(self) -> AsyncIterator[tuple[str, str] | None]:
        """``(event, body)`` on every change, the first at once; ``None`` when nothing
        changed for a while (the caller sends a keep-alive). Ends when the feed closes."""
        watcher = _Watcher()
        self._watchers.add(watcher)
        self._watched.set()
        self._wake.set()
        try:
            while not self._closed.is_set():
                try:
                    await asyncio.wait_for(watcher.ready.wait(), self._keepalive)
                except TimeoutError:
                    yield None
                    continue
                watcher.ready.clear()
                if watcher.pending is None:
                    continue
                event, body = watcher.pending
                watcher.pending = None
                watcher.last = body
                yield event, body
        finally:
            self._watchers.discard(watcher)
            if not self._watchers:
                self._watched.clear()
