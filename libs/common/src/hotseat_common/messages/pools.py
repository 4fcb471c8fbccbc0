"""The controller admin API's view of a pool (``GET /v1/pools``)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class PoolView(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    resident: str | None
    """The member that serves: ``None`` while a swap unloads or loads (nothing serves)."""
    swapping: str | None
    """The target of a swap in flight (or pending behind a draining incumbent)."""
    phase: str
    unloading: str | None = None
    """The member a swap is unloading right now (phase ``unloading``)."""
    loading: str | None = None
    """The member a swap is loading right now (phase ``loading``)."""
    swap_id: str | None = None
    """The id of the swap in flight, as its audit events and its waiters' carry it."""
    swap_elapsed_s: float | None = None
    """Time since the swap in flight began its unload."""
    swap_expected_s: float | None = None
    """While a swap is in flight, the mean measured time of recent swaps to its target
    (``None`` before one was measured: another member's says nothing about this one's);
    otherwise the pool's mean measured swap time (``None`` until a swap was measured)."""
    swap_remaining_s: float | None = None
    """Expected minus elapsed (at least 0) while a swap is in flight and measured."""
    epoch: int
    leases: dict[str, int]
    waiters: dict[str, int]
    unhealthy: bool = False
    """The resident failed its health checks while serving: kept until its leases end."""
    relearning: bool = False
    """The store lost its state and routers are renewing their leases back."""
    closed: bool = False
    """The resident takes no new request: another member's waited ``maxWait``; it drains.
    A capacity pool: some of its residents do (``closing``)."""
    closing: list[str] = []
    """A capacity pool's residents that take no new request: another member waited
    ``maxWait``, and they are what its load must evict; they drain (docs/adr/0008)."""
    queue: list[str] = []
    """Members with waiting requests, in the order they will be swapped in (most urgent
    first: arrival moved earlier by priority)."""
    queue_waited_s: dict[str, float] = {}
    """For each member of ``queue``: how long its most urgent waiter counts as having
    waited, its priority included (its wait plus its priority times the pool's
    ``priorityAging``); the queue is in decreasing order of it."""
    residents: list[str] = []
    """A capacity pool's residency set: every member loaded and serving (docs/adr/0008);
    a one-resident pool lists its resident."""
    loading_also: list[str] = []
    """A capacity pool: the other members the plan in flight loads beside ``loading``, at
    the same time, not yet loaded (docs/adr/0008)."""
    evicting: list[str] = []
    """A capacity pool: the members the plan in flight unloads (or, after a failed plan,
    still has to confirm gone)."""
    capacity_gib: float | None = None
    """A capacity pool's memory; ``None`` for a one-resident pool."""
    free_gib: float | None = None
    """A capacity pool's memory not held by a resident, a member loading or one being
    unloaded."""
    preloaded: list[str] = []
    """A capacity pool's residents that the answering controller loaded by ``preload``
    as it started and that have stayed resident since (evicted, a member stops being
    listed, even when demand loads it again)."""
    preload_pending: list[str] = []
    """A capacity pool's ``preload`` members the answering controller has still to load
    (it preloads once, as it starts, when they fit)."""


class CopyStatus(StrEnum):
    """A model group's member on one pool, as the group index shows it."""

    RESIDENT = "resident"
    """Resident, answering and open: placements are granted there."""
    LOADING = "loading"
    """Being made resident for the group (its swap, or the group's claim)."""
    ABSENT = "absent"
    """Not resident; a placement may load it there."""
    FAILED = "failed"
    """Its last load failed (backoff), or it is resident but unwell: not placed."""
    LOST = "lost"
    """No controller replica has read its pool lately (or ever): not placed."""


class GroupCopyView(BaseModel):
    """One member of a model group: the group's copy on one pool."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pool: str
    member: str
    status: CopyStatus
    leases: int
    """Live leases granted through the group on this copy."""
    slots: int
    """Requests one copy serves at once (the group's config)."""
    waiting: int
    """Requests placed on this copy and held."""


class GroupView(BaseModel):
    """A model group (docs/adr/0012) as its index shows it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    copies: list[str]
    """Pools where its member is resident and serves."""
    loading: list[str]
    """Pools where a copy is being loaded for it."""
    leases: dict[str, int]
    """Pool -> live leases granted through the group."""
    waiting: dict[str, int]
    """Pool -> requests placed there and held."""
    placed: str | None = None
    """The pool of its last placement (granted or held)."""
    reason: str | None = None
    """Why it was placed there (a ``PlacementReason``)."""
    placed_ms: int | None = None
    """When (epoch ms, the store's clock)."""
    members: list[GroupCopyView] = []
    """Every member pool of the group, in pool order: its copy's status, leases, slots
    and waiters."""


class PoolList(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    pools: list[PoolView]
    groups: list[GroupView] = []
    """The model groups, when the config has any."""


POOL_UPDATES_PATH = "/v1/pool-updates"
"""The controller's server-sent events stream of :class:`PoolList` (the web console and
``hotseat status --watch`` read it): one event at once, then one on every change."""
POOL_UPDATES_EVENT = "pools"
"""The SSE ``event:`` name of a :class:`PoolList` on that stream."""
POOL_UPDATES_ERROR_EVENT = "unavailable"
"""The SSE ``event:`` name sent when the controller cannot read its pools (its store is
down); its data is ``{"error": "..."}``. The next readable state follows as ``pools``."""
