"""The activation conversation between routers and the pool controller.

router                         controller (queue group)
  acquire  ------------------>  granted | incumbent_busy | wait | error
  (wait: re-ask on a PoolStateChanged for the pool, or the re-ask timer)
  renew    ------------------>  RenewReply (ok=False: the lease is gone)
  release  ------------------>  Ack        (published; asked when the caller must know)
  cancel   ------------------>  Ack        (a held request gives up)
  report   ------------------>  Ack        (a granted member failed to answer)
controller publishes PoolStateChanged on every transition of a pool.

Identity: a waiter and a lease belong to one **attempt** of one router (its own id for one
try of one backend), never to anything a client sent; the client's request id travels
along for logs and audit only. Time: the router sends durations (``hold_s``), and the
controller anchors them to the store's clock, so no two clocks are ever compared.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from hotseat_common.config.model import PoolActivation
from hotseat_common.errors import ErrorCode
from hotseat_common.messages.base import WireModel


class WaitReason(StrEnum):
    """Why a request is held (a ``wait`` reply)."""

    SWAP_IN_FLIGHT = ErrorCode.SWAP_IN_FLIGHT.value
    DRAINING = "draining"
    RECONCILING = ErrorCode.RECONCILING.value
    """The pool state is being rebuilt from the drivers."""
    RECOVERING = "recovering"
    """The resident stopped answering its health checks while it still serves; the request
    waits until it answers again or is replaced."""
    CLOSED = "closed"
    """The request's member is resident but closed to new requests: another member's
    request waited the pool's ``maxWait``; this one waits for the swap back."""


class AcquireRequest(WireModel):
    pool: str
    member: str
    mode: PoolActivation = PoolActivation.WAIT
    attempt: str = Field(min_length=1, max_length=128)
    """The router's own id for this try of this backend: keys the waiter and the lease (a
    re-ask of the same attempt gets the same lease)."""
    request_id: str
    """The client's request id, for audit and logs only."""
    router: str
    hold_s: float = Field(ge=0)
    """How much longer the router holds this request, from when this question leaves it."""
    priority: int | None = Field(default=None, ge=0)
    """How urgent the request is (its rule's, or its allowed header's); unset: 0."""


class Granted(WireModel):
    status: Literal["granted"] = "granted"
    lease_id: str
    ttl_s: float
    epoch: int
    swap_id: str | None = None
    """The swap that made the member resident, when this request waited for it."""


class IncumbentBusyReply(WireModel):
    status: Literal[ErrorCode.INCUMBENT_BUSY] = ErrorCode.INCUMBENT_BUSY
    resident: str | None = None
    retry_after_s: float
    swap_id: str | None = None
    """The swap in flight that keeps the member from the request, if one is."""


class WaitReply(WireModel):
    status: Literal["wait"] = "wait"
    reason: WaitReason
    target: str | None = None
    epoch: int
    retry_after_s: float
    position: int | None = None
    """The request's place in line: 1 when the next swap is its member's."""
    eta_s: float | None = None
    """The earliest it can be served, from measured swap times (a lower bound)."""
    swap_id: str | None = None
    """The swap in flight the request waits through (``None`` while a drain has not yet
    become a swap)."""


class ErrorReply(WireModel):
    status: Literal["error"] = "error"
    code: ErrorCode
    """Mostly one of :data:`hotseat_common.errors.ACTIVATION_ERRORS`."""
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
    epoch: int = 0
    """The epoch the lease was granted at: after the store lost its state, a renewal of a
    lease it no longer knows is adopted back only for the resident of that epoch or later."""
    attempt: str = ""
    request_id: str = ""
    router: str = ""
    group: str | None = None
    """The model group that placed the lease (docs/adr/0012): its lease count follows."""
    longest_s: float | None = Field(default=None, ge=0)
    """The longest request that ended on the lease since its last renewal (seconds);
    absent: none ended. A lease shared by back-to-back requests may never be released
    while they last: its request times come this way (docs/adr/0006)."""


class RenewReply(WireModel):
    ok: bool
    """False with no ``code``: the lease is gone for good (expired, released or revoked)."""
    ttl_s: float = 0.0
    code: ErrorCode | None = None
    """Set when the controller could not tell (``controller_unavailable``, ``reconciling``)."""
    shareable: bool = True
    """False while the member fails its health checks: the router keeps the lease for the
    requests on it but stops sharing it; new requests ask the controller."""


class ReleaseRequest(WireModel):
    pool: str
    member: str
    lease_id: str
    group: str | None = None
    """The model group that placed the lease (docs/adr/0012): its lease count follows."""
    requests: int | None = Field(default=None, ge=0)
    """How many requests used the lease (a router shares one among its concurrent
    requests for a member); absent: one. A capacity pool counts them as the member's
    recent demand, which orders its evictions (docs/adr/0008)."""
    longest_s: float | None = Field(default=None, ge=0)
    """The longest any request on the lease ran (seconds, from its grant or share to its
    end); absent: not measured. With ``maxWait``, the member's recent ones tell how long
    it takes to drain once closed (docs/adr/0006)."""


class CancelRequest(WireModel):
    pool: str
    member: str
    attempt: str
    """The attempt that gives up: only its waiter, and its lease on ``member``, go."""
    group: str | None = None
    """The model group that placed the attempt: its count of held requests follows."""


class DispatchFailureReport(WireModel):
    pool: str
    member: str
    request_id: str
    reason: str


class Ack(WireModel):
    ok: bool = True
    code: ErrorCode | None = None
    message: str | None = None


class PoolStateChanged(WireModel):
    """Published on the pool's events subject after every transition."""

    pool: str
    epoch: int
    phase: Literal["idle", "draining", "unloading", "loading", "unknown"]
    resident: str | None = None
    target: str | None = None
    reason: str
    closed: bool | None = None
    """True when the resident takes no new request (``maxWait``): a router stops sharing
    its leases on it, so that new requests ask (and wait) instead."""
    closing: list[str] | None = None
    """A capacity pool's residents that take no new request (``maxWait``): the same for
    each of them."""
    swap_id: str | None = None
    """The swap in flight (phases ``unloading`` and ``loading``)."""
