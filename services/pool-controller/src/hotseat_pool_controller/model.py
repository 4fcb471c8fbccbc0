"""What pool decisions read and return: a snapshot of one pool in, a decision out.

A :class:`Decision` is what to answer, which writes to make, and the preconditions the
decision relied on; :class:`~hotseat_pool_controller.store.pool.PoolStore` applies it
atomically and asks again from a fresh snapshot when a precondition no longer holds. How
each piece is kept in Redis is the store's codec's business
(:mod:`hotseat_pool_controller.store.codec`). See docs/adr/0001.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from hotseat_common.config.model import BusySignal, Pool, PoolActivation
from hotseat_common.messages import (
    AcquireRequest,
    ErrorReply,
    Granted,
    IncumbentBusyReply,
    PoolOutcome,
    WaitReply,
)


class Phase(StrEnum):
    UNKNOWN = "unknown"
    IDLE = "idle"
    DRAINING = "draining"
    UNLOADING = "unloading"
    LOADING = "loading"


IN_FLIGHT = frozenset({Phase.UNLOADING, Phase.LOADING})
"""A swap in flight: from the incumbent's unload until the target is ready."""
SERVING = frozenset({Phase.IDLE, Phase.DRAINING})
"""The resident serves (sticky residency: granted in both)."""


DEMAND_HALF_LIFE_MS = 600_000
"""A capacity pool's recent demand per member halves every ten minutes: long enough to
tell a popular member from a rare one across bursts, short enough that what was popular
an hour ago counts for little."""


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    """The parts of a pool's config (and the controller's timing) that decisions use."""

    name: str
    members: tuple[str, ...]
    max_waiters: int
    lease_ttl_ms: int
    swap_timeout_ms: int
    failure_backoff_ms: int
    busy_signal: BusySignal
    default: str | None
    heartbeat_ttl_ms: int = 3000
    waiter_grace_ms: int = 5000
    """After a swap, the new resident's waiters count as busy this long (they are re-asking
    right now); later, a waiter left behind by a dead router no longer pins the resident."""
    max_wait_ms: int | None = None
    """Once another member's most urgent waiter has waited this long, the resident takes
    no new lease (docs/adr/0006); ``None``: sticky residency, nothing closes."""
    min_residency_ms: int | None = None
    """How long a resident stays before it may be closed for another member; ``None``:
    twice the pool's mean measured swap time, at least one second."""
    priority_aging_ms: int = 10_000
    """A waiter of priority ``p`` ranks as if it had waited ``p`` times this much longer."""
    thrash_window_ms: int = 60_000
    """A swap back to the previous resident sooner than this after the last commit is a
    swap back (counted, audited)."""
    idle_unload_ms: Mapping[str, int] = field(default_factory=dict)
    """member -> how long it may stay resident with nothing to do (absent: for ever)."""
    capacity_gib: float | None = None
    """A capacity pool's memory (docs/adr/0008): members resident together while their
    ``memory_gib`` fit in it; ``None``: one resident at a time."""
    memory_gib: Mapping[str, float] = field(default_factory=dict)
    """member -> the memory it holds while loaded (a capacity pool's members)."""
    pinned: frozenset[str] = frozenset()
    """Members kept resident: loaded at start, never evicted (a capacity pool's)."""
    preload: tuple[str, ...] = ()
    """Members loaded as a controller starts when they fit beside the residents, then
    evicted like any other (a capacity pool's), in config order."""
    demand_half_life_ms: int = 0
    """A capacity pool counts each member's recent demand (the requests its leases
    served), halving it every this long: the eviction order's tie-break between members
    of the same reload cost (docs/adr/0008); 0: not counted (a one-resident pool)."""

    @property
    def has_capacity(self) -> bool:
        return self.capacity_gib is not None

    def gib(self, member: str | None) -> float:
        return self.memory_gib.get(member, 0.0) if member else 0.0

    @classmethod
    def from_config(cls, pool: Pool, *, heartbeat_ttl_s: float = 3.0) -> PoolPolicy:
        def ms(seconds: float | None) -> int | None:
            return None if seconds is None else int(seconds * 1000)

        idle: dict[str, int] = {}
        for member in pool.members:
            after = member.idle_unload_after or pool.idle_unload_after
            if after is not None:
                idle[member.name] = int(after * 1000)
        return cls(
            name=pool.name,
            members=tuple(m.name for m in pool.members),
            max_waiters=pool.max_waiters,
            lease_ttl_ms=int(pool.lease_ttl * 1000),
            swap_timeout_ms=int(pool.swap_timeout * 1000),
            failure_backoff_ms=int(pool.swap_failure_backoff * 1000),
            busy_signal=pool.busy_signal,
            default=pool.default,
            heartbeat_ttl_ms=int(heartbeat_ttl_s * 1000),
            max_wait_ms=ms(pool.max_wait),
            min_residency_ms=ms(pool.min_residency),
            priority_aging_ms=int(pool.priority_aging * 1000),
            thrash_window_ms=int(pool.thrash_window * 1000),
            idle_unload_ms=idle,
            capacity_gib=pool.capacity.total_gib if pool.capacity else None,
            memory_gib={m.name: m.memory_gi_b for m in pool.members if m.memory_gi_b is not None},
            pinned=frozenset(m.name for m in pool.members if m.pinned),
            preload=tuple(m.name for m in pool.members if m.preload),
            demand_half_life_ms=DEMAND_HALF_LIFE_MS if pool.capacity else 0,
        )


@dataclass(frozen=True, slots=True)
class AttemptLease:
    """The lease an attempt already holds (a re-asked acquire gets it again)."""

    member: str
    lease_id: str
    epoch: int
    expiry_ms: int = 0
    """When the lease expires unless renewed (Redis clock); 0: unknown."""


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """One pool as read in one round trip; counts are of live entries only."""

    now_ms: int
    phase: Phase
    resident: str | None = None
    target: str | None = None
    from_member: str | None = None
    epoch: int = 0
    version: int = 0
    owner: str | None = None
    heartbeat_ms: int = 0
    started_ms: int = 0
    deadline_ms: int = 0
    committed_ms: int = 0
    """When the resident became resident (Redis clock)."""
    forced: bool = False
    parked: bool = False
    """An admin unloaded the pool: do not warm the default member until demand arrives."""
    unhealthy: bool = False
    """The resident failed its health checks while it still served (docs/adr/0005)."""
    relearn_ms: int = 0
    """Until then (Redis clock) the resident counts as busy: the store lost its leases and
    routers are renewing them back (docs/adr/0005)."""
    rebuilt_epoch: int = 0
    """The epoch the state was last rebuilt at, after the store lost it (0: never): a swap
    whose claim is older was lost with the state (docs/adr/0005, point 9)."""
    closed: bool = False
    """The resident takes no new lease: another member waited ``maxWait`` (docs/adr/0006)."""
    closed_ms: int = 0
    """When the resident was closed (Redis clock; 0: not closed, or its drain recorded)."""
    previous: str | None = None
    """The member resident before the current one."""
    released_ms: int = 0
    """When the resident's last lease was released (Redis clock; 0: never)."""
    swap_id: str | None = None
    """The swap in flight, or the last one (the one that made the resident resident)."""
    cause: str | None = None
    """The request id of the request that set the pool draining toward ``target``."""
    loading_ms: int = 0
    """When the swap in flight began its load (Redis clock; 0: not yet)."""
    leases: Mapping[str, int] = field(default_factory=dict)
    waiters: Mapping[str, int] = field(default_factory=dict)
    lease_expiry: Mapping[str, int] = field(default_factory=dict)
    """member -> when its first live lease expires unless renewed (Redis clock); read
    only for a supervisor's tick (what it may sleep on, docs/adr/0011)."""
    waiter_deadline: Mapping[str, int] = field(default_factory=dict)
    """member -> when its first live waiter gives up (Redis clock); as ``lease_expiry``."""
    failures: Mapping[str, int] = field(default_factory=dict)
    """member -> milliseconds left of its swap-failure backoff."""
    swap_times: tuple[float, ...] = ()
    urgency: Mapping[str, int] = field(default_factory=dict)
    """member -> virtual arrival (Redis clock) of its most urgent live waiter."""
    member_swap_times: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    """member -> recent durations of swaps to it, newest first."""
    member_drain_times: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    """member -> recent drains of it once closed (close to last lease's end), newest first."""
    member_request_times: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    """member -> the longest request on each of its recently released leases, newest first
    (kept for a pool with ``maxWait``)."""
    attempt_lease: AttemptLease | None = None
    attempt_waiting: bool = False
    """The asking attempt is one of the pool's live waiters already."""
    residents: frozenset[str] = frozenset()
    """A capacity pool's residency set: members loaded and serving (docs/adr/0008)."""
    evicts: tuple[str, ...] = ()
    """The members the plan in flight unloads (a capacity pool's), or that a failed plan
    or a loss left to confirm gone."""
    also: tuple[str, ...] = ()
    """The other members a capacity pool's plan in flight loads beside its target, at the
    same time (each joins the set as it is loaded; one that failed is listed in
    ``evicts``)."""
    unwell: frozenset[str] = frozenset()
    """A capacity pool's residents that fail their health checks while they serve."""
    used: Mapping[str, int] = field(default_factory=dict)
    """member -> when it was last loaded or last released its last lease (Redis clock)."""
    loaded: Mapping[str, int] = field(default_factory=dict)
    """member -> when a capacity pool's plan last loaded it (its commit; Redis clock)."""
    demand: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    """member -> (requests its leases served, decayed as of when; Redis clock): a
    capacity pool's recent demand, decayed further to now by :func:`recent_demand`."""
    surplus: frozenset[str] = frozenset()
    """Members that are copies beyond demand: their model group (docs/adr/0012) holds a
    copy resident on another pool, as this replica last read the group's pools. Not
    stored: the replica adds it to each read. A capacity pool evicts them first."""
    closing: frozenset[str] = frozenset()
    """A capacity pool's residents closed to new leases: another member waited
    ``maxWait`` and they are what its plan must evict (docs/adr/0008)."""

    def live_leases(self, member: str | None) -> int:
        return self.leases.get(member, 0) if member else 0

    @property
    def relearning(self) -> bool:
        return self.relearn_ms > self.now_ms

    def serving(self, member: str | None) -> bool:
        """``member`` has live leases, or may have ones the store is still relearning."""
        return member is not None and (
            self.live_leases(member) > 0
            or (self.relearning and (member == self.resident or member in self.residents))
        )

    def live_waiters(self, member: str | None) -> int:
        return self.waiters.get(member, 0) if member else 0

    @property
    def total_waiters(self) -> int:
        return sum(self.waiters.values())


# --- writes ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SetState:
    """New values for some fields of the pool's state, as the store keeps them (made by
    :func:`hotseat_pool_controller.store.codec.set_state` from typed values); ``bump``
    moves the state's ``version``."""

    fields: Mapping[str, str]
    bump: bool = True

    def merged(self, more: SetState) -> SetState:
        """This change and ``more`` in one write (``more`` wins a field both set)."""
        return SetState({**self.fields, **more.fields}, bump=self.bump or more.bump)


@dataclass(frozen=True, slots=True)
class AddLease:
    member: str
    lease_id: str
    expiry_ms: int
    attempt: str
    request_id: str
    """The client's request id (audit only)."""
    router: str
    epoch: int
    """The epoch it was granted at (a renewal after the store lost it is adopted by it)."""


@dataclass(frozen=True, slots=True)
class AddWaiter:
    member: str
    attempt: str
    deadline_ms: int
    urgency_ms: int = 0
    """Its virtual arrival: when it arrived, moved earlier by its priority (kept when the
    same attempt asks again)."""


@dataclass(frozen=True, slots=True)
class RemoveWaiter:
    member: str
    attempt: str


@dataclass(frozen=True, slots=True)
class ClearWaiters:
    member: str


@dataclass(frozen=True, slots=True)
class SetFailure:
    member: str
    reason: str
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class RecordSwapTime:
    seconds: float
    member: str | None = None
    """The member the swap loaded (its own list too); ``None``: an unload only."""


@dataclass(frozen=True, slots=True)
class RecordDrainTime:
    """A closed resident drained: how long from its close to its last lease's end."""

    member: str
    seconds: float


@dataclass(frozen=True, slots=True)
class RevokeLeases:
    """Drop every lease on ``member``: renewals are refused, routers end their streams."""

    member: str


Op = (
    SetState
    | AddLease
    | AddWaiter
    | RemoveWaiter
    | ClearWaiters
    | SetFailure
    | RecordSwapTime
    | RecordDrainTime
    | RevokeLeases
)


@dataclass(frozen=True, slots=True)
class Preconditions:
    """What must still hold when the writes are applied."""

    version: int | None = None
    state_equals: Mapping[str, str] = field(default_factory=dict)
    state_unknown: bool = False
    """The state hash is missing, or was written on another Redis server (only a rebuild
    writes then); otherwise every decision requires a state written on this server."""
    zero_leases: tuple[str, ...] = ()
    zero_waiters: tuple[str, ...] = ()
    waiter_cap: int | None = None
    """Total live waiters of the pool must stay below this."""
    over_cap: ErrorReply | None = None
    """The answer when ``waiter_cap`` is reached by the time the writes would land."""


@dataclass(frozen=True, slots=True)
class SwapOrder:
    """Tells the caller to run (or resume) a swap as its owner."""

    target: str
    epoch: int
    from_member: str | None
    resume: bool = False
    loading: bool = False
    """Resumed in ``loading``: the target's load began under an earlier owner."""
    swap_id: str = ""
    """The swap's id (kept through a takeover; logs and traces carry it)."""
    evicts: tuple[str, ...] | None = None
    """A capacity pool's plan: the only members it unloads (``None``: a one-resident
    pool's swap, which unloads every member but the target)."""
    over_slots: bool = False
    """An operator's forced action: the swap unloads without reading ``/slots``
    (``busySignal: leasesAndSlots``; leases still count). A takeover reads them."""


@dataclass(frozen=True, slots=True)
class CacheFigures:
    """What one swap's prompt-cache steps moved, over all its members (docs/adr/0007)."""

    saved_bytes: int = 0
    saved_tokens: int = 0
    save_ms: float = 0.0
    restored_bytes: int = 0
    restored_tokens: int = 0
    restore_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class AuditIntent:
    outcome: PoolOutcome
    member: str | None = None
    from_member: str | None = None
    to_member: str | None = None
    epoch: int | None = None
    reason: str | None = None
    request_id: str | None = None
    cache: CacheFigures | None = None
    """A swap's prompt-cache figures, on its terminal event when it saved or restored."""
    swap_id: str | None = None
    unload_ms: float | None = None
    """A swap's phase times, on its terminal event."""
    load_ms: float | None = None
    evicts: tuple[str, ...] | None = None
    """A capacity pool's plan: the members it evicts (``swap_started``)."""
    also: tuple[str, ...] | None = None
    """A capacity pool's plan: the other members it loads beside its target
    (``swap_started``)."""
    event_id: str | None = None
    """The event's id when it must be the same whoever sends it (an end several owners of
    a swap may send, docs/adr/0005 point 9); a new random one when ``None``."""

    @classmethod
    def of_swap(
        cls,
        outcome: PoolOutcome,
        target: str | None,
        from_member: str | None,
        epoch: int,
        reason: str | None = None,
        *,
        snap: PoolSnapshot | None = None,
    ) -> AuditIntent:
        """A swap's event: it is about its target, from the member it started from; with
        ``snap`` (the swap's state right before it ends), its id and its phase times."""
        if snap is None:
            return cls(outcome, target, from_member, target, epoch, reason)
        unload_ms, load_ms = swap_phases_ms(snap)
        return cls(
            outcome,
            target,
            from_member,
            target,
            epoch,
            reason,
            swap_id=snap.swap_id,
            unload_ms=unload_ms,
            load_ms=load_ms,
        )


def swap_phases_ms(snap: PoolSnapshot) -> tuple[float | None, float | None]:
    """How long the swap in flight in ``snap`` has unloaded and loaded so far (Redis
    clock); ``None`` for a phase it has not reached."""
    if not snap.started_ms:
        return None, None
    if not snap.loading_ms:
        return float(max(0, snap.now_ms - snap.started_ms)), None
    return (
        float(max(0, snap.loading_ms - snap.started_ms)),
        float(max(0, snap.now_ms - snap.loading_ms)),
    )


Reply = Granted | IncumbentBusyReply | WaitReply | ErrorReply


@dataclass(frozen=True, slots=True)
class Decision:
    reply: Reply | None = None
    ops: tuple[Op, ...] = ()
    pre: Preconditions = Preconditions()
    swap: SwapOrder | None = None
    audit: tuple[AuditIntent, ...] = ()
    need_idle_check: tuple[str, ...] = ()
    """Members whose ``/slots`` must be read before deciding (busySignal leasesAndSlots)."""

    @property
    def writes(self) -> bool:
        return bool(self.ops)

    @property
    def changes_state(self) -> bool:
        return any(isinstance(op, SetState) and op.bump for op in self.ops)


NOTHING = Decision()


@dataclass(frozen=True, slots=True)
class AcquireAsk:
    member: str
    mode: PoolActivation
    attempt: str
    """The router's attempt: the key of the waiter and the lease."""
    request_id: str
    """The client's request id (audit only)."""
    router: str
    deadline_ms: int
    """When the router stops holding the request (Redis clock)."""
    lease_id: str
    """A fresh id the decision may use if it grants."""
    priority: int = 0
    now_ms: int = 0
    """When the question arrived (Redis clock)."""

    @classmethod
    def of(cls, request: AcquireRequest, *, now_ms: int, lease_id: str) -> AcquireAsk:
        """The router sends how long it holds the request; the deadline is anchored to the
        store's clock here (``now_ms``, Redis ``TIME``), never to any router's."""
        return cls(
            member=request.member,
            mode=request.mode,
            attempt=request.attempt,
            request_id=request.request_id,
            router=request.router,
            deadline_ms=now_ms + int(request.hold_s * 1000),
            lease_id=lease_id,
            priority=request.priority or 0,
            now_ms=now_ms,
        )

    def urgency_ms(self, policy: PoolPolicy) -> int:
        """Its virtual arrival: now, moved earlier by its priority (docs/adr/0006)."""
        return self.now_ms - self.priority * policy.priority_aging_ms
