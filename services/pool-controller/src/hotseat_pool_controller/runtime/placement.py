"""One model group as this controller replica answers it (docs/adr/0012): read the group
index, decide the placement (pure), claim a new copy when the decision starts one, run
the placed pool's own acquire, and count the outcome in the index.

The acquire is the pool's, unchanged: fenced and atomic as for a plain backend. The index
only steers which pool is asked.
"""

from __future__ import annotations

from collections.abc import Mapping

from hotseat_common.config.model import HotseatConfig, ModelGroup
from hotseat_common.errors import ErrorCode
from hotseat_common.keys import Keys
from hotseat_common.logging import get_logger
from hotseat_common.messages import (
    AcquireRequest,
    ErrorReply,
    Granted,
    GroupCopyView,
    GroupView,
    IncumbentBusyReply,
    PlacementReason,
    PlaceReply,
    PlaceRequest,
    WaitReply,
)
from hotseat_pool_controller.decisions.placement import (
    CopyState,
    GroupMember,
    GroupPolicy,
    Placement,
    copies_of,
    copy_state,
    copy_status,
    decide_placement,
)
from hotseat_pool_controller.model import PoolPolicy, PoolSnapshot
from hotseat_pool_controller.runtime.answers import PoolAnswers
from hotseat_pool_controller.store.group import GroupStore
from hotseat_pool_controller.store.link import RedisLink
from hotseat_pool_controller.store.pool import ConflictError

log = get_logger(__name__)

MAX_CLAIMS = 5
"""Placements that lost their claim to another one are decided again this often, plus
twice per copy the group may hold (each copy can be filled by joins, then claimed, under
one request's feet once)."""
SESSION_TTL_MS = 30 * 60 * 1000
"""How long a session's pool is remembered after its last turn."""
BUSY_RETRY_AFTER_S = 1.0
RESERVE_MS = 10_000
"""A request counted on a copy by its placement, until its grant or hold is recorded:
this long at most (a replica that dies in between)."""


def group_policy(config: HotseatConfig, group: ModelGroup) -> GroupPolicy:
    members = []
    for m in group.members:
        backend = config.backend(m.backend)
        if backend is not None and backend.pool is not None:
            members.append(GroupMember(backend.pool.name, backend.pool.member, m.backend, m.slots))
    return GroupPolicy(group.name, group.max_copies, tuple(members))


class GroupPlacer:
    def __init__(
        self,
        policy: GroupPolicy,
        store: GroupStore,
        pools: Mapping[str, PoolAnswers],
        *,
        stale_ms: int,
    ) -> None:
        self.policy = policy
        self.store = store
        self._pools = pools
        self._stale_ms = stale_ms

    async def place(self, request: PlaceRequest) -> PlaceReply:
        decided = await self._decide(request)
        if isinstance(decided, PlaceReply):
            return decided
        pool, reason, reserved = decided
        answers = self._pools.get(pool)
        member = self.policy.on(pool)
        if answers is None or member is None:
            if reserved:
                await self._counted(pool, request, None, None)
            return PlaceReply(
                reason=PlacementReason.NO_POOL,
                reply=ErrorReply(code=ErrorCode.UNKNOWN_POOL, message=f"no pool {pool!r} here"),
            )
        if request.placed is not None and request.placed != pool:
            await self._leave(request.placed, request.attempt)
        try:
            reply = await answers.acquire(
                AcquireRequest(
                    pool=pool,
                    member=member.member,
                    mode=request.mode,
                    attempt=request.attempt,
                    request_id=request.request_id,
                    router=request.router,
                    hold_s=request.hold_s,
                    priority=request.priority,
                )
            )
        except BaseException:
            if reserved:
                await self._counted(pool, request, None, None)
            raise
        if reserved or isinstance(reply, (Granted, WaitReply)):
            await self._counted(pool, request, reply, reason)
        return PlaceReply(
            pool=pool, member=member.member, backend=member.backend, reason=reason, reply=reply
        )

    async def _decide(
        self, request: PlaceRequest
    ) -> tuple[str, PlacementReason, bool] | PlaceReply:
        """The pool, why, and whether the request is already counted there (a take); a
        reply when no pool can serve it. A take or a join that found every copy filled, or a claim
        that lost its race, is decided again from a fresh read."""
        group = self.policy
        for _ in range(MAX_CLAIMS + 2 * group.max_copies):
            snap = await self.store.read(request.session)
            placement = decide_placement(
                group,
                snap,
                mode=request.mode,
                stale_ms=self._stale_ms,
                placed=request.placed,
                avoid=request.avoid,
            )
            pool = placement.pool
            if pool is None:
                return _unplaced(placement.reason, group.name)
            if placement.take:
                taken = await self._take(request.attempt, placement)
                if taken is not None:
                    return taken[0], taken[1], True
                continue
            if placement.join:
                copies = [(m.pool, m.slots) for p in placement.join if (m := group.on(p))]
                joined = await self.store.join(request.attempt, copies, reserve_ms=RESERVE_MS)
                if joined is not None:
                    return joined, PlacementReason.JOINS_LOADING_COPY, True
                continue
            answers = self._pools.get(pool)
            if not placement.claim or answers is None:
                return pool, placement.reason, False
            if await self.store.claim(
                pool,
                snap.version,
                answers.policy.swap_timeout_ms,
                attempt=request.attempt,
                reserve_ms=RESERVE_MS,
            ):
                return pool, placement.reason, True
        raise ConflictError(f"group {group.name}: every placement lost a race")

    async def view(self) -> GroupView:
        """The group as its index shows it now (for status and the console)."""
        snap = await self.store.read()
        copies = copies_of(self.policy, snap, stale_ms=self._stale_ms)
        last = await self.store.last()
        return GroupView(
            name=self.policy.name,
            copies=copies.resident,
            loading=copies.loading,
            leases=dict(sorted(snap.leases.items())),
            waiting=dict(sorted(snap.waiting.items())),
            placed=last[0] if last else None,
            reason=last[1] if last else None,
            placed_ms=last[2] if last else None,
            members=[
                GroupCopyView(
                    pool=m.pool,
                    member=m.member,
                    status=copy_status(copies, snap, m.pool, stale_ms=self._stale_ms),
                    leases=snap.leases.get(m.pool, 0),
                    slots=m.slots,
                    waiting=snap.waiting.get(m.pool, 0),
                )
                for m in sorted(self.policy.members, key=lambda m: m.pool)
            ],
        )

    async def _counted(
        self, pool: str, request: PlaceRequest, reply: object, reason: PlacementReason | None
    ) -> None:
        """The index counts a grant as a lease, a hold as a waiter, and anything else
        (``None``: no answer) as nothing; the request's reservation ends in each case."""
        if isinstance(reply, Granted):
            lease_id: str | None = reply.lease_id
            ttl_ms, session, session_ttl_ms = (
                round(reply.ttl_s * 1000),
                request.session,
                SESSION_TTL_MS,
            )
        elif isinstance(reply, WaitReply):
            lease_id, ttl_ms, session, session_ttl_ms = None, round(request.hold_s * 1000), None, 0
        else:
            lease_id, ttl_ms, session, session_ttl_ms = None, 0, None, 0
        await self.store.record(
            pool,
            request.attempt,
            lease_id=lease_id,
            ttl_ms=ttl_ms,
            session=session,
            session_ttl_ms=session_ttl_ms,
            reason=reason.value if reason is not None else "",
        )

    async def _take(self, attempt: str, placement: Placement) -> tuple[str, PlacementReason] | None:
        """The resident copy chosen again from the live counts, and the request counted
        there, in one script (exact spreading of a burst); ``None``: none has room now."""
        prefer = placement.pool if placement.reason is PlacementReason.SESSION_AFFINITY else None
        copies = [(m.pool, m.slots) for p in placement.take if (m := self.policy.on(p))]
        taken = await self.store.take(
            attempt, copies, room=placement.room, prefer=prefer, reserve_ms=RESERVE_MS
        )
        if taken is None:
            return None
        if taken == prefer:
            return taken, PlacementReason.SESSION_AFFINITY
        return taken, PlacementReason.RESIDENT_LEAST_BUSY

    async def _leave(self, pool: str, attempt: str) -> None:
        """A held request re-placed elsewhere leaves its first pool's waiters."""
        member = self.policy.on(pool)
        answers = self._pools.get(pool)
        if member is not None and answers is not None:
            await answers.cancel(member.member, attempt)
        await self.store.forget_waiter(pool, attempt)


def _unplaced(reason: PlacementReason, group: str) -> PlaceReply:
    if reason == PlacementReason.BUSY:
        reply: IncumbentBusyReply | ErrorReply = IncumbentBusyReply(
            retry_after_s=BUSY_RETRY_AFTER_S
        )
    else:
        reply = ErrorReply(
            code=ErrorCode.SWAP_FAILED,
            message=f"no pool of group {group!r} can serve it (lost, or its last load failed)",
            retry_after_s=BUSY_RETRY_AFTER_S,
        )
    return PlaceReply(reason=reason, reply=reply)


Residency = dict[str, dict[str, bool]]
"""group -> pool -> the group's member is resident there, as this replica last read it
(every replica reads every pool): which copies are beyond demand."""


class CopyWriter:
    """Keeps one pool's entries in the indexes of the groups it serves: written from each
    snapshot the supervisor reads, when it changed or is half ``refresh_ms`` old."""

    def __init__(
        self, stores: list[tuple[GroupStore, str]], refresh_ms: int, residency: Residency
    ) -> None:
        self._stores = stores
        """(group store, the group's member on this pool)."""
        self._refresh_ms = refresh_ms
        self._residency = residency
        """Shared by the writers of every pool of this replica."""
        self._last: dict[str, CopyState] = {}

    def surplus(self, pool: str) -> frozenset[str]:
        """This pool's members that are copies beyond demand: their group is resident on
        another pool, as this replica last read the pools."""
        return frozenset(
            member
            for store, member in self._stores
            if any(on for p, on in self._residency.get(store.group, {}).items() if p != pool)
        )

    @property
    def members(self) -> frozenset[str]:
        """The pool's members that are copies of a model group."""
        return frozenset(member for _, member in self._stores)

    async def busy(self, pool: str, member: str, lease_id: str, ttl_ms: int | None) -> None:
        """A lease on ``member`` of this one-resident pool was (or is about to be) granted
        or renewed for ``ttl_ms``, or ended (``None``): counted in the index of every group
        whose copy here a load would have to evict it for (one command per such group,
        whatever the number of pools), so that no tick need rewrite their entries."""
        for store, copy in self._stores:
            if copy != member:
                await store.busy(pool, lease_id, ttl_ms)

    async def observe(self, pool: str, snap: PoolSnapshot, policy: PoolPolicy) -> None:
        surplus = self.surplus(pool)
        for store, member in self._stores:
            state = copy_state(snap, policy, member, surplus)
            self._residency.setdefault(store.group, {})[pool] = state.resident
            last = self._last.get(store.group)
            fresh = (
                last is not None
                and state.same(last)
                and snap.now_ms - last.at_ms < self._refresh_ms // 2
            )
            if not fresh:
                await store.write_copy(pool, state)
                self._last[store.group] = state


def build_placement(
    config: HotseatConfig,
    link: RedisLink,
    keys: Keys,
    pools: Mapping[str, PoolAnswers],
    *,
    stale_ms: int,
) -> tuple[dict[str, GroupPlacer], dict[str, list[tuple[GroupStore, str]]]]:
    """A placer per group, and for each pool the (group store, member) pairs it serves."""
    placers: dict[str, GroupPlacer] = {}
    serves: dict[str, list[tuple[GroupStore, str]]] = {}
    for group in config.model_groups:
        policy = group_policy(config, group)
        store = GroupStore(link, keys, group.name)
        placers[group.name] = GroupPlacer(policy, store, pools, stale_ms=stale_ms)
        for m in policy.members:
            serves.setdefault(m.pool, []).append((store, m.member))
    return placers, serves
