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

from typing import Protocol

from hotseat_common.errors import ErrorCode, HotseatError


class DriverError(HotseatError):
    """A driver could not do or confirm what was asked."""

    code = ErrorCode.DRIVER_ERROR


class Fenced(DriverError):
    """A command from a swap owner older than one that already acted on the member (it
    lost the swap while frozen or partitioned): refused by the backend's fence."""

    code = ErrorCode.FENCED


class ResidencyDriver(Protocol):
    async def load(self, member: str, *, epoch: int) -> None: ...

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
