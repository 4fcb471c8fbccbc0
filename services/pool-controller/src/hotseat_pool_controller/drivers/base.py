"""The one small interface every residency driver implements.

Contract (the controller's safety rests on it):
- ``unload`` returns only once the member is confirmed gone (process exited, memory freed,
  port closed); it is idempotent and cheap when the member is already unloaded.
- ``load`` returns only once the member is ready to serve; it is idempotent. The caller
  bounds it with the swap's deadline (cancellation must leave nothing half-started that
  a later ``unload`` cannot stop).
- ``is_idle`` answers from the backend's own view (``/slots``); it raises
  :class:`DriverError` when it cannot tell, and the controller then treats the member as
  busy (fail closed).
- ``epoch`` is the swap's fencing token; drivers that can pass it on (the sim) do, so a
  stale controller's commands are refused by the backend itself.
- ``confirm_gone`` answers True only when the driver can *prove* the member holds nothing
  any more (no process, no pod, the model unloaded); when it cannot tell (a process that
  is alive but does not answer, a backend it cannot see) it answers False. Recovery never
  takes a member with live leases for gone on less (docs/adr/0005).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, Protocol, runtime_checkable

from hotseat_common.errors import ErrorCode, HotseatError


class DriverError(HotseatError):
    """A driver could not do or confirm what was asked."""

    code = ErrorCode.DRIVER_ERROR


class Fenced(DriverError):
    """A command from a swap owner older than one that already acted on the member (it
    lost the swap while frozen or partitioned): refused by the backend's fence."""

    code = ErrorCode.FENCED


class ResidencyDriver(Protocol):
    async def load(self, member: str, *, epoch: int) -> None:
        """Returns once the member answers as ready to serve: one that runs but does not
        answer is restarted (process) or waited for until the swap's timeout fails the
        load (http, kubernetes), so a swap never commits a silent member."""
        ...

    async def unload(self, member: str, *, epoch: int) -> None: ...

    async def is_ready(self, member: str) -> bool:
        """True when the member answers its health check as ready to serve."""
        ...

    async def is_idle(self, member: str) -> bool: ...

    async def confirm_gone(self, member: str) -> bool:
        """True only when the member is provably not running (memory free, nothing to cut)."""
        ...

    async def fence(self, epoch: int) -> None:
        """Make ``epoch`` the oldest the members obey, without acting on them (a rebuild
        of a lost pool state moves the epoch with no command to send). Best effort: a
        driver whose backend cannot record it does nothing."""
        ...

    async def residency(self) -> dict[str, bool]:
        """Member -> whether it is loaded right now (ready or on its way), for rebuilding."""
        ...

    async def aclose(self) -> None: ...


class CacheFailure(StrEnum):
    """Why a slot was not saved or restored (the ``reason`` label of the failure counter)."""

    UNSUPPORTED = "unsupported"
    """The server cannot (started without ``--slot-save-path``; a slot holding images)."""
    BUSY = "busy"
    """A slot is processing, or ``/slots`` did not answer: no save without proof of idle."""
    TIMEOUT = "timeout"
    """``saveTimeout`` or ``restoreTimeout`` elapsed."""
    MODEL_CHANGED = "model_changed"
    """The model file is not the one the process was started with."""
    ERROR = "error"
    """Anything else: an error answer, an unreadable directory, a file the server refused."""


@dataclass(frozen=True, slots=True)
class SlotFailure:
    reason: CacheFailure
    detail: str
    slot: int | None = None


NOT_RUNNING = "not running"
"""The note of a step that found nothing to save or restore into: no event, no figure."""


@dataclass(frozen=True, slots=True)
class CacheReport:
    """What one save or restore of a member's slots did (docs/adr/0007)."""

    member: str
    action: Literal["save", "restore"]
    slots: int = 0
    """Slots saved or restored."""
    tokens: int = 0
    bytes: int = 0
    seconds: float = 0.0
    """Wall-clock time the step took."""
    failures: tuple[SlotFailure, ...] = ()
    dropped_stale: int = 0
    """Files of another model identity deleted (never restorable again)."""
    dropped_budget: int = 0
    """Files deleted to keep the member's and the pool's budgets."""
    note: str | None = None
    """Why nothing was attempted, when nothing was (not running, nothing saved)."""


@runtime_checkable
class CarriesCaches(Protocol):
    """A driver whose members may carry their prompt cache over swaps.

    ``save_caches`` and ``restore_caches`` never raise for a failed save or restore (the
    report says what failed); each is bounded by the member's own timeout. ``carries`` is
    False for a member without ``cache.carryOver``; then neither is called.
    """

    def carries(self, member: str) -> bool: ...

    async def save_caches(self, member: str) -> CacheReport: ...

    async def restore_caches(self, member: str) -> CacheReport: ...
