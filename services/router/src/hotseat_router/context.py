"""What the router knows about one request while it handles it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from hotseat_common.errors import ErrorCode
from hotseat_router.asgi import Receive


@dataclass(slots=True)
class RequestContext:
    request_id: str
    started: float = field(default_factory=time.monotonic)
    rule: str | None = None
    model: str | None = None
    backend: str | None = None
    pool: str | None = None
    member: str | None = None
    status: int | None = None
    finished: bool = False
    """The terminal audit event was emitted."""
    response_done: bool = False
    """The last body message is being sent: a disconnect now is no longer an interruption."""
    interrupted: ErrorCode | None = None
    """Why the handling task was cancelled on purpose: ``client_disconnected``, ``lease_lost``."""
    task: asyncio.Task[object] | None = None
    watcher: asyncio.Task[None] | None = None
    """Watches for the client leaving while the request is dispatched and relayed."""

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def interrupt(self, reason: ErrorCode) -> None:
        """Cancel the handling task once, remembering why (a second reason is ignored)."""
        if self.interrupted is not None or self.response_done or self.task is None:
            return
        self.interrupted = reason
        self.task.cancel()

    def absorb_interrupt(self) -> ErrorCode | None:
        """After catching ``CancelledError``: our own interruption's reason (uncancelled), or
        ``None`` when somebody else cancelled the task and the error must propagate."""
        if self.interrupted is None or self.task is None:
            return None
        self.task.uncancel()
        return self.interrupted


async def watch_disconnect(receive: Receive, ctx: RequestContext) -> None:
    """Interrupt the request when the client goes away (the body was already read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            ctx.interrupt(ErrorCode.CLIENT_DISCONNECTED)
            return


async def watch_lease(lost: asyncio.Event, ctx: RequestContext) -> None:
    """Interrupt the request when the controller refuses to renew its lease."""
    await lost.wait()
    ctx.interrupt(ErrorCode.LEASE_LOST)
