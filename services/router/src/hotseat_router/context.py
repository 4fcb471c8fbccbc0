"""What the router knows about one request while it handles it.

Two parts, each changed only through its verbs: the **record** (what the request's audit
event reports: its model, rule, the backend that answered) and the **interruption**
control (the handling task, the watchers that cancel it when the client leaves or the
lease is lost, and whether the last body message is already on its way).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hotseat_common.config.model import Backend
from hotseat_common.errors import ErrorCode
from hotseat_router.asgi import CLIENT_LEFT, ClientLeftHook, Receive, Scope
from hotseat_router.keepalive import HeldStream
from hotseat_router.usage import Usage

if TYPE_CHECKING:
    from hotseat_router.activation.protocol import LeaseLoss


@dataclass(slots=True)
class RequestContext:
    request_id: str
    client: str = ""
    """Who sent the request, as passive health tells clients apart: a digest of its API
    key when keys are configured, else its address."""
    api_key: str | None = None
    """The client's API key as a short digest, when keys are configured."""
    started: float = field(default_factory=time.monotonic)
    rule: str | None = None
    model: str | None = None
    backend: str | None = None
    pool: str | None = None
    member: str | None = None
    status: int | None = None
    priority: int = 0
    held_stream: HeldStream | None = None
    """Set for a streaming request its rule answers early while held (``holdKeepAlive``)."""
    held_s: float = 0.0
    """How long the request was held for pool leases, all its attempts together."""
    usage: Usage | None = None
    """The upstream's token usage, when its answer said."""
    swap_id: str | None = None
    """The swap the request caused or waited for: the last one that loaded its member,
    else the last one it waited through."""
    _swap_for_member: bool = False
    placement: str | None = None
    """Why a model group placed the request on its pool (docs/adr/0012)."""
    finished: bool = False
    """The terminal audit event was emitted."""
    outcome: str | None = None
    """That event's outcome."""
    response_done: bool = False
    """The last body message is being sent: a disconnect now is no longer an interruption."""
    interrupted: ErrorCode | None = None
    """Why the handling task was cancelled on purpose: ``client_disconnected``, ``lease_lost``."""
    _task: asyncio.Task[object] | None = None
    _unwatch_client: ClientLeftHook | None = None
    _watchers: list[asyncio.Task[None]] = field(default_factory=list)
    _lease_loss: LeaseLoss | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    # --- the record -----------------------------------------------------------------------

    def asked_for(self, model: str | None) -> None:
        self.model = model

    def routed(self, rule: str | None) -> None:
        self.rule = rule

    def asks_pool(self, pool: str, member: str) -> None:
        """A pool is asked for a member: the event names the last one asked even when no
        backend answers (``pool_activation_timeout``, ``pool_incumbent_busy``)."""
        self.pool, self.member = pool, member

    def waits_for_swap(self, swap_id: str | None, *, for_member: bool) -> None:
        """The pool said the request waits through swap ``swap_id`` (``for_member``: one
        that loads the member it asked for)."""
        if swap_id is None or (self._swap_for_member and not for_member):
            return
        self.swap_id = swap_id
        self._swap_for_member = for_member

    def placed(self, pool: str, member: str, reason: str) -> None:
        self.pool, self.member, self.placement = pool, member, reason

    def placement_header(self) -> str | None:
        """``gpu2; reason=resident_least_busy`` for a placed request."""
        if self.placement is None:
            return None
        return f"{self.pool}; reason={self.placement}"

    def held_for(self, seconds: float) -> None:
        self.held_s += seconds

    def hold_ms(self) -> int:
        return round(self.held_s * 1000)

    def answered_by(self, backend: Backend, status: int) -> None:
        self.backend = backend.name
        self.status = status
        pooled = backend.pool
        self.pool, self.member = (pooled.name, pooled.member) if pooled else (None, None)

    def finish_once(self) -> bool:
        """True the first time: the caller records the request's one terminal outcome."""
        first = not self.finished
        self.finished = True
        return first

    # --- interruption -----------------------------------------------------------------------

    def last_body(self) -> None:
        """The last body message is being sent: the request can no longer be interrupted."""
        self.response_done = True

    def watch_client(self, scope: Scope, receive: Receive) -> None:
        """From now on, the client leaving interrupts the current task (the body was read).
        The connection says so itself when it offers ``CLIENT_LEFT`` (the router's own
        server); under another ASGI server a task awaits ``receive()`` for it."""
        self._task = asyncio.current_task()
        extensions = scope.get("extensions")
        hook = extensions.get(CLIENT_LEFT) if extensions else None
        if hook is None:
            self._watchers.append(asyncio.create_task(self._receive_disconnect(receive)))
            return
        self._unwatch_client = hook["unwatch"]
        hook["watch"](self._client_gone)

    def watch_lease(self, lost: LeaseLoss) -> None:
        """Interrupt the request when its lease is lost, until :meth:`unwatch_lease` (the
        caller's, before the lease is released)."""
        self._lease_loss = lost
        lost.watch(self._lease_gone)

    def unwatch_lease(self) -> None:
        lost, self._lease_loss = self._lease_loss, None
        if lost is not None:
            lost.unwatch(self._lease_gone)

    def stop_watching(self) -> None:
        self.unwatch_lease()
        if self._unwatch_client is not None:
            self._unwatch_client(self._client_gone)
            self._unwatch_client = None
        for watcher in self._watchers:
            watcher.cancel()

    def interrupt(self, reason: ErrorCode) -> None:
        """Cancel the handling task once, remembering why (a second reason is ignored)."""
        if self.interrupted is not None or self.response_done or self._task is None:
            return
        self.interrupted = reason
        self._task.cancel()

    def absorb_interrupt(self) -> ErrorCode | None:
        """After catching ``CancelledError``: our own interruption's reason (uncancelled), or
        ``None`` when somebody else cancelled the task and the error must propagate."""
        if self.interrupted is None or self._task is None:
            return None
        self._task.uncancel()
        return self.interrupted

    def _client_gone(self) -> None:
        self.interrupt(ErrorCode.CLIENT_DISCONNECTED)

    async def _receive_disconnect(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self._client_gone()
                return

    def _lease_gone(self) -> None:
        self.interrupt(ErrorCode.LEASE_LOST)
