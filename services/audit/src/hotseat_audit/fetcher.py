"""Batches from a JetStream pull consumer through one long-lived inbox.

nats-py's ``PullSubscription.fetch`` awaits every message separately (a timer and a task
per message), which costs more than storing the event. This fetcher subscribes once to
``<inbox>.*`` with a callback that only appends to a buffer, and sends pull requests
with a fresh reply token each, so a status message (404 no messages, 408 expired, 409
conflict) is attributed to the request it ends and a late status of an older request is
ignored.

A fetch first takes what earlier requests already delivered, then asks for the rest with
``no_wait`` (a backlog drains at full speed); only when nothing at all is available does
it leave a request waiting up to ``timeout`` and return as soon as the first message
arrives. Messages that arrive after a fetch returned stay in the buffer for the next one;
messages still buffered at close are negatively acknowledged so that JetStream hands them
out again at once instead of after the ack wait.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from itertools import count

import nats.errors
import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

STATUS = "Status"
DESCRIPTION = "Description"
NO_MESSAGES = "404"
REQUEST_TIMEOUT = "408"
CONFLICT = "409"
HEARTBEAT = "100"
NO_RESPONDERS = "503"
REPLY_MARGIN = 0.5
"""Extra time to wait for the server's own expiry status before giving up locally."""


class ConsumerGone(RuntimeError):
    """JetStream says the consumer no longer exists (deleted, or its stream was)."""


class PullFetcher:
    def __init__(
        self, nc: NatsClient, stream: str, consumer: str, api_prefix: str = "$JS.API"
    ) -> None:
        self._nc = nc
        self._next_subject = f"{api_prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._inbox = nc.new_inbox()
        self._sub: Subscription | None = None
        self._buffer: deque[Msg] = deque()
        self._tokens = count(1)
        self._current = ""
        self._wake = asyncio.Event()
        self._wake_at = 1
        self._gone: str | None = None

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_msg)

    async def _on_msg(self, msg: Msg) -> None:
        status = msg.headers.get(STATUS) if msg.headers else None
        if status is None:
            self._buffer.append(msg)
            if len(self._buffer) >= self._wake_at:
                self._wake.set()
            return
        if status == HEARTBEAT or msg.subject != self._current:
            return  # flow control, or the end of an older request
        description = (msg.headers or {}).get(DESCRIPTION, "")
        if status == NO_RESPONDERS:
            self._gone = "no responders: the consumer or its stream does not exist"
        elif status == CONFLICT and "deleted" in description.lower():
            self._gone = description
        self._wake.set()

    async def fetch(self, batch: int, timeout: float) -> list[Msg]:
        """Up to ``batch`` messages; an empty list when none came within ``timeout``."""
        if self._gone is not None:
            raise ConsumerGone(self._gone)
        need = batch - len(self._buffer)
        if need > 0:
            await self._request({"batch": need, "no_wait": True}, wake_at=batch, timeout=timeout)
        if not self._buffer:
            expires = int(timeout * 1e9)
            await self._request({"batch": batch, "expires": expires}, wake_at=1, timeout=timeout)
        if self._gone is not None:
            raise ConsumerGone(self._gone)
        taken = min(batch, len(self._buffer))
        return [self._buffer.popleft() for _ in range(taken)]

    async def _request(self, body: dict[str, object], *, wake_at: int, timeout: float) -> None:
        self._current = f"{self._inbox}.{next(self._tokens)}"
        self._wake_at = wake_at
        self._wake.clear()
        if len(self._buffer) >= wake_at:
            return
        await self._nc.publish(self._next_subject, orjson.dumps(body), reply=self._current)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout + REPLY_MARGIN)

    def reset(self) -> None:
        """Forget a "consumer gone" verdict once the consumer has been recreated."""
        self._gone = None

    def interrupt(self) -> None:
        """End the wait of a fetch in progress now (it returns what has arrived)."""
        self._wake.set()

    async def close(self) -> None:
        """Stop receiving; buffered messages are handed back to JetStream."""
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        while self._buffer:
            with contextlib.suppress(nats.errors.Error):
                await self._buffer.popleft().nak()
