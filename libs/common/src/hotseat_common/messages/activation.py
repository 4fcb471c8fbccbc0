"""The activation conversation between routers and the pool controller.

router                         controller (queue group)
  acquire  ------------------>  granted | incumbent_busy | wait | error
  (wait: re-ask on a PoolStateChanged for the pool, or the re-ask timer)
  renew    ------------------>  RenewReply (ok=False: the lease is gone)
  release  ------------------>  Ack
  cancel   ------------------>  Ack        (a held request gives up)
  report   ------------------>  Ack        (a granted member failed to answer)
controller publishes PoolStateChanged on every transition of a pool.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from hotseat_common.config.model import PoolActivation
from hotseat_common.messages.base import WireModel


class AcquireRequest(WireModel):
    pool: str
    member: str
    mode: PoolActivation = PoolActivation.WAIT
    request_id: str
    router: str
    deadline: float
    """Unix time (seconds) after which the router stops holding this request."""


class Granted(WireModel):
    status: Literal["granted"] = "granted"
    lease_id: str
    ttl_s: float
    epoch: int


class IncumbentBusyReply(WireModel):
    status: Literal["incumbent_busy"] = "incumbent_busy"
    resident: str | None = None
    retry_after_s: float


class WaitReply(WireModel):
    status: Literal["wait"] = "wait"
    reason: Literal["swap_in_flight", "draining", "reconciling"]
    target: str | None = None
    epoch: int
    retry_after_s: float


class ErrorReply(WireModel):
    status: Literal["error"] = "error"
    code: str
    """One of :data:`hotseat_common.errors.ACTIVATION_ERRORS`."""
    message: str
    retry_after_s: float | None = None


AcquireReply = Annotated[
    Granted | IncumbentBusyReply | WaitReply | ErrorReply, Field(discriminator="status")
]
ACQUIRE_REPLY: TypeAdapter[Granted | IncumbentBusyReply | WaitReply | ErrorReply] = TypeAdapter(
    AcquireReply
)


class RenewRequest(WireModel):
    pool: str
    member: str
    lease_id: str


class RenewReply(WireModel):
    ok: bool
    """False with no ``code``: the lease is gone for good (expired or released)."""
    ttl_s: float = 0.0
    code: str | None = None
    """Set when the controller could not tell (e.g. ``controller_unavailable``)."""


class ReleaseRequest(WireModel):
    pool: str
    member: str
    lease_id: str


class CancelRequest(WireModel):
    pool: str
    member: str
    request_id: str


class DispatchFailureReport(WireModel):
    pool: str
    member: str
    request_id: str
    reason: str


class Ack(WireModel):
    ok: bool = True
    code: str | None = None
    message: str | None = None


class PoolStateChanged(WireModel):
    """Published on the pool's events subject after every transition."""

    pool: str
    epoch: int
    phase: Literal["idle", "draining", "unloading", "loading", "unknown"]
    resident: str | None = None
    target: str | None = None
    reason: str
