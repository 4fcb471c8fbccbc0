"""Placement: a router asks for a model group, the controller names one pool and acquires
there (docs/adr/0012).

router                               controller (queue group)
  place(group, attempt, hold, ...) -->  PlaceReply: pool, member, reason, and that pool's
                                        acquire reply (granted | wait | incumbent_busy | error)
  (wait: the router holds on that pool's events and asks ``place`` again with the same
   attempt and ``placed``: the controller keeps the placement while the pool still serves)

Renewals and releases of a lease granted through a group go to the pool as usual and name
the group, which counts the group's live leases per pool.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from hotseat_common.config.model import PoolActivation
from hotseat_common.messages.activation import AcquireReply
from hotseat_common.messages.base import WireModel


class PlacementReason(StrEnum):
    """Why a request was placed where it was (audit, logs, the placement header)."""

    SESSION_AFFINITY = "session_affinity"
    """The copy that served the session's last turn, resident with a free slot."""
    RESIDENT_LEAST_BUSY = "resident_least_busy"
    """A resident copy: the one with the fewest live leases, then the most slots free."""
    JOINS_LOADING_COPY = "joins_loading_copy"
    """A copy being loaded for the group (single flight), with slots to spare."""
    COLD_CHEAPEST_EVICTION = "cold_cheapest_eviction"
    """No copy was resident or loading: a load on the pool whose eviction costs least."""
    SECOND_COPY = "second_copy"
    """Every copy is full and ``maxCopies`` allows another: a load on another pool."""
    KEPT = "kept"
    """A held request asked again: it stays on the pool it was placed on."""
    BUSY_SHORTEST_WAIT = "busy_shortest_wait"
    """Every pool is busy with other members: held (Wait) on the shortest expected wait."""
    BUSY = "busy"
    """Every pool is busy with other members (IfIdle): the walk moves on."""
    NO_POOL = "no_pool"
    """No member pool is alive (lost, or its last load failed)."""


class PlaceRequest(WireModel):
    group: str
    mode: PoolActivation = PoolActivation.WAIT
    attempt: str = Field(min_length=1, max_length=128)
    """The router's own id for this try of the group (keys the waiter and the lease)."""
    request_id: str
    """The client's request id, for audit and logs only."""
    router: str
    hold_s: float = Field(ge=0)
    """How much longer the router holds this request, from when this question leaves it."""
    priority: int | None = Field(default=None, ge=0)
    session: str | None = Field(default=None, max_length=256)
    """The conversation (``x-hotseat-session``, else the OpenAI ``user``): placed where its
    last turn was served when that copy is resident and has a free slot."""
    placed: str | None = None
    """The pool an earlier answer placed this attempt on (a held request asking again)."""
    avoid: tuple[str, ...] = Field(default=(), max_length=256)
    """Pools this router does not send the group's requests to now (their member's
    backend is quarantined by its passive health): never placed on."""


class PlaceReply(WireModel):
    pool: str | None = None
    """The pool placed on (``None``: the group is busy or has no live pool)."""
    member: str | None = None
    backend: str | None = None
    """The backend that fronts the placed member."""
    reason: PlacementReason
    reply: AcquireReply
    """That pool's acquire answer (an ``incumbent_busy`` or error of the group's own when
    nothing was placed)."""
