"""Fleet placement (docs/adr/0012): which pool's member serves one request for a model
group. Pure: the group index in, one placement out.

Two functions. :func:`copy_state` turns one pool's snapshot into the group index's entry
for the member on that pool (the pool supervisors write it). :func:`decide_placement`
reads the entries of every member pool, with the group's live leases, waiters and claims,
and names one pool:

0. a held request asking again stays on its pool (``kept``) while that pool is still a
   candidate and no warm copy with a free slot is elsewhere;
1. the session's copy, resident with a free slot (``session_affinity``);
2. the resident copy with the fewest live leases among those with a free slot
   (``resident_least_busy``);

   (1, 2 and 5 choose a resident copy from counts that concurrent placements may have
   changed since the read: the placement names the copies to choose among, and the group
   store's ``take`` chooses again and counts the request in one script.)
3. a copy loading for the group with slots to spare (``joins_loading_copy``: single flight);
4. fewer copies than ``maxCopies``: a load where no busy member is evicted; one that
   evicts nothing or only copies beyond demand (another group's copy that is resident on
   another pool too) first, then the cheapest eviction (``cold_cheapest_eviction``, or
   ``second_copy`` beside other copies);
5. every copy full: the least busy resident copy, or loading copy;
6. no copy and no pool to load it: IfIdle is told busy (``busy``), Wait is held on the pool
   with the shortest expected wait (``busy_shortest_wait``).

A pool whose entry is stale (no controller has read it lately), whose member is in its
swap-failure backoff or resident but unwell, or that the asking router quarantined is not
a candidate.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from hotseat_common.config.model import PoolActivation
from hotseat_common.messages import CopyStatus, PlacementReason
from hotseat_pool_controller.decisions.busy import NOT_READ, incumbent_busy
from hotseat_pool_controller.decisions.capacity import make_plan, reload_cost_s
from hotseat_pool_controller.decisions.schedule import eta_s
from hotseat_pool_controller.model import IN_FLIGHT, SERVING, Phase, PoolPolicy, PoolSnapshot


@dataclass(frozen=True, slots=True)
class CopyState:
    """The group member on one pool, as that pool's last read showed it."""

    resident: bool = False
    """Granted at once: resident, answering and open."""
    loading: bool = False
    """A swap (or plan) to it is in flight."""
    placeable: bool = False
    """It can become resident now without evicting a member that serves."""
    cost_s: int = 0
    """Expected reload time of what its load evicts (whole seconds; 0: nothing)."""
    unused_ms: int = 0
    """Since when what its load evicts has been unused (Redis clock; earlier goes first)."""
    wait_s: float = 0.0
    """The earliest a request held for it could be served (a lower bound)."""
    failed: bool = False
    """It cannot serve: its last load failed and its backoff runs, or it is resident but
    unwell (its pool's health check failed, or the member was marked unwell)."""
    at_ms: int = 0
    """When the pool was read (Redis clock)."""
    sole: bool = False
    """Its load evicts a member that is not a copy beyond demand (one that no other pool
    holds resident for its group): a load that evicts only such copies, or nothing, goes
    first."""

    def same(self, other: CopyState) -> bool:
        """Equal but for when it was read."""
        return (
            self.resident,
            self.loading,
            self.placeable,
            self.cost_s,
            self.unused_ms,
            round(self.wait_s),
            self.failed,
            self.sole,
        ) == (
            other.resident,
            other.loading,
            other.placeable,
            other.cost_s,
            other.unused_ms,
            round(other.wait_s),
            other.failed,
            other.sole,
        )


def copy_state(
    snap: PoolSnapshot, policy: PoolPolicy, member: str, surplus: Collection[str] = ()
) -> CopyState:
    """The entry of ``member`` on this pool, from one snapshot; ``surplus``: this pool's
    members that are copies beyond demand (their group is resident on another pool)."""
    failed = snap.failures.get(member, 0) > 0 or (
        member in snap.unwell if policy.has_capacity else snap.resident == member and snap.unhealthy
    )
    in_flight = snap.phase in IN_FLIGHT
    loading = in_flight and snap.target == member
    wait, _ = eta_s(snap, member, snap.now_ms)
    if policy.has_capacity:
        resident = member in snap.residents and member not in snap.unwell
        plan = None if in_flight or resident else make_plan(snap, policy, member)
        draining_other = snap.phase == Phase.DRAINING and snap.target not in {None, member}
        placeable = plan is not None and not draining_other and not failed
        evicts = plan.evicts if plan is not None else ()
    else:
        resident = (
            snap.resident == member
            and snap.phase in SERVING
            and not (snap.unhealthy or snap.closed)
        )
        placeable = (
            snap.phase == Phase.IDLE
            and snap.resident != member
            and not incumbent_busy(snap, policy, NOT_READ, leases=False)
            and not failed
        )
        evicts = (snap.resident,) if placeable and snap.resident is not None else ()
    return CopyState(
        resident=resident,
        loading=loading,
        placeable=placeable,
        cost_s=sum(reload_cost_s(snap, m) for m in evicts),
        unused_ms=min((snap.used.get(m, snap.released_ms) for m in evicts), default=0),
        wait_s=wait,
        failed=failed,
        at_ms=snap.now_ms,
        sole=any(m not in surplus for m in evicts),
    )


@dataclass(frozen=True, slots=True)
class GroupMember:
    pool: str
    member: str
    backend: str
    slots: int


@dataclass(frozen=True, slots=True)
class GroupPolicy:
    name: str
    max_copies: int
    members: tuple[GroupMember, ...]

    def on(self, pool: str) -> GroupMember | None:
        return next((m for m in self.members if m.pool == pool), None)


@dataclass(frozen=True, slots=True)
class GroupSnapshot:
    """The group index as read in one round trip (counts of live entries only)."""

    now_ms: int
    copies: Mapping[str, CopyState]
    """pool -> the member's copy on it."""
    leases: Mapping[str, int]
    """pool -> live leases granted through the group."""
    waiting: Mapping[str, int]
    """pool -> requests placed there and held."""
    claims: Mapping[str, int]
    """pool -> until when (Redis clock) a load started for the group counts as loading."""
    session_pool: str | None = None
    version: int = 0
    busy: Mapping[str, int] = field(default_factory=dict)
    """pool -> live leases on another member of that one-resident pool (counted by its
    grants, renewals and releases): its copy is not placeable while any lives."""


@dataclass(frozen=True, slots=True)
class Placement:
    pool: str | None
    reason: PlacementReason
    claim: bool = False
    """The placement starts a copy: claimed first, so that concurrent demand joins it."""
    take: tuple[str, ...] = ()
    """A resident copy is chosen: the copies to choose among again, in the same script
    that counts the request (the group store's ``take``), so that a burst placed at one
    instant spreads as requests placed one after another do. ``pool`` is the choice the
    read showed; the take may name another pool of ``take``."""
    room: bool = True
    """The take chooses only a copy with a free slot (fewest live leases, then most slots
    free); ``False``: every copy is full, the one least over its slots."""
    join: tuple[str, ...] = ()
    """A loading copy is joined: the copies to choose among again, in the same script
    that counts the request as their waiter (the group store's ``join``), so that a cold
    burst puts at most ``slots`` waiters on a loading copy before a second copy is
    claimed."""


@dataclass(frozen=True, slots=True)
class Copies:
    """The group's candidate pools in one read of its index."""

    live: dict[str, CopyState]
    """Fresh, not failed, not avoided: pool -> its entry."""
    resident: list[str]
    loading: list[str]
    """Being made resident for the group (its swap, or a claim that has not expired)."""


def copies_of(
    group: GroupPolicy, snap: GroupSnapshot, *, stale_ms: int, avoid: Collection[str] = ()
) -> Copies:
    live = {
        m.pool: c
        for m in sorted(group.members, key=lambda m: m.pool)
        if (c := snap.copies.get(m.pool)) is not None
        and c.at_ms + stale_ms >= snap.now_ms
        and not c.failed
        and m.pool not in avoid
    }
    resident = [p for p, c in live.items() if c.resident]
    loading = [
        p
        for p, c in live.items()
        if not c.resident and (c.loading or snap.claims.get(p, 0) > snap.now_ms)
    ]
    return Copies(live, resident, loading)


def copy_status(copies: Copies, snap: GroupSnapshot, pool: str, *, stale_ms: int) -> CopyStatus:
    """What the group's member on ``pool`` is, for status and the console (``copies``:
    the same read's :func:`copies_of`)."""
    if pool in copies.resident:
        return CopyStatus.RESIDENT
    if pool in copies.loading:
        return CopyStatus.LOADING
    entry = snap.copies.get(pool)
    if entry is None or entry.at_ms + stale_ms < snap.now_ms:
        return CopyStatus.LOST
    return CopyStatus.FAILED if entry.failed else CopyStatus.ABSENT


def decide_placement(  # noqa: C901, PLR0911 - one answer per step of the ADR's order
    group: GroupPolicy,
    snap: GroupSnapshot,
    *,
    mode: PoolActivation,
    stale_ms: int,
    placed: str | None = None,
    avoid: Collection[str] = (),
) -> Placement:
    """Where one request for ``group`` goes (module docstring); never on a pool of
    ``avoid`` (the asking router quarantined its member's backend)."""
    copies_now = copies_of(group, snap, stale_ms=stale_ms, avoid=avoid)
    live, resident, loading = copies_now.live, copies_now.resident, copies_now.loading

    def slots(pool: str) -> int:
        member = group.on(pool)
        return member.slots if member is not None else 1

    def leases(pool: str) -> int:
        return snap.leases.get(pool, 0)

    def waiting(pool: str) -> int:
        return snap.waiting.get(pool, 0)

    with_room = [p for p in resident if leases(p) < slots(p)]
    if placed in live and (placed in resident or placed in loading or not with_room):
        # A held request stays where it waits, unless a warm copy with room is elsewhere.
        return Placement(placed, PlacementReason.KEPT)
    session = snap.session_pool
    if session in with_room:
        return Placement(session, PlacementReason.SESSION_AFFINITY, take=tuple(with_room))
    if with_room:
        best = min(with_room, key=lambda p: (leases(p), leases(p) - slots(p), p))
        return Placement(best, PlacementReason.RESIDENT_LEAST_BUSY, take=tuple(with_room))
    joinable = [p for p in loading if waiting(p) < slots(p)]
    if joinable:
        return Placement(
            min(joinable, key=lambda p: (waiting(p), p)),
            PlacementReason.JOINS_LOADING_COPY,
            join=tuple(joinable),
        )
    copies = len(resident) + len(loading)
    if copies < group.max_copies:
        candidates = [
            p
            for p, c in live.items()
            if p not in resident and p not in loading and c.placeable and not snap.busy.get(p)
        ]
        if candidates:
            best = min(
                candidates, key=lambda p: (live[p].sole, live[p].cost_s, live[p].unused_ms, p)
            )
            reason = (
                PlacementReason.SECOND_COPY if copies else PlacementReason.COLD_CHEAPEST_EVICTION
            )
            return Placement(best, reason, claim=True)
    if resident:
        best = min(resident, key=lambda p: (leases(p) - slots(p), p))
        return Placement(
            best, PlacementReason.RESIDENT_LEAST_BUSY, take=tuple(resident), room=False
        )
    if loading:
        return Placement(
            min(loading, key=lambda p: (waiting(p), p)), PlacementReason.JOINS_LOADING_COPY
        )
    if not live:
        return Placement(None, PlacementReason.NO_POOL)
    if mode == PoolActivation.IF_IDLE:
        return Placement(None, PlacementReason.BUSY)
    best = min(live, key=lambda p: (live[p].wait_s, waiting(p), p))
    return Placement(best, PlacementReason.BUSY_SHORTEST_WAIT)
