"""The pool state's layout in Redis, the one place it is spelled (with the Lua scripts that
read it, :mod:`.scripts`): typed state changes encoded to the ``state`` hash, and snapshots
decoded from what the snapshot script returns.

The ``state`` hash, per pool (docs/adr/0001 has the meaning of each field):

    phase      idle | draining | unloading | loading
    resident   the member holding the GPU ("" when none)
    target     the member a swap (or a drain) is for
    from       the member a swap started from
    epoch      the swap's fencing token          version  bumped by every transition
    owner      the controller running the swap   heartbeat   its claim's expiry (ms)
    started    when the swap began (ms)          deadline    its swapTimeout (ms)
    committed  when the resident became resident (ms)
    forced     "1": a warm-up or admin swap, loaded without waiters
    parked     "1": an admin unload; the default member is not warmed
    unhealthy  "1": the resident fails its health checks while it serves
    relearn    until then (ms) the resident counts as busy: the store lost its leases
    rebuilt    the epoch the state was last rebuilt at (the store lost it): an owner that
               lost its claim to that ends its swap itself (docs/adr/0005, point 9)
    closed     "1": the resident takes no new lease (another member waited ``maxWait``)
    previous   the member resident before the current one (a swap back to it is counted)
    released   when the resident's last lease was released (ms; written by the release
               script, not a transition: it moves no ``version``)
    store      the ``run_id`` of the Redis server the state was written on (scripts only)
    swap       the id of the swap in flight, or of the last one (kept through a takeover)
    cause      the request id of the request that set the pool draining toward its target
    loading    when the swap in flight began its load (ms)
    residents  a capacity pool's residency set, comma-separated (docs/adr/0008)
    evicts     the members a capacity pool's plan in flight unloads, comma-separated
    also       the other members a capacity pool's plan loads beside its target, at the
               same time, comma-separated
    unwell     a capacity pool's residents that fail their health checks while they
               serve (no new lease for them), comma-separated
    used.<m>   when member ``m`` was last loaded (the commit) or released its last lease
               (ms; the release script writes it, no ``version`` move)
    loaded.<m> when a capacity pool's plan last loaded member ``m`` (ms; its commit)
    demand.<m> a capacity pool's recent demand for ``m``: the requests its released leases
               served, halved every ``demand_half_life_ms``, as of ``demandat.<m>`` (ms;
               the release script writes both, no ``version`` move)
    closing    a capacity pool's residents closed to new leases (another member waited
               ``maxWait``; its plan evicts them once they drain), comma-separated
    failed.<m> until then (ms) member ``m`` sits out its swap-failure backoff (no
               ``version`` move; a lapsed one stays until the next failure)

All times are on the store's clock (Redis ``TIME``: :data:`.scripts.NOW`). A lease's
record in ``lease-meta`` is the JSON object ``{member, attempt, request_id, router,
epoch}`` (``adopted`` when a renewal wrote it back).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

import orjson

from hotseat_common.keys import Keys
from hotseat_pool_controller.model import (
    AddLease,
    AddWaiter,
    AttemptLease,
    ClearWaiters,
    Op,
    Phase,
    PoolSnapshot,
    Preconditions,
    RecordDrainTime,
    RecordSwapTime,
    RemoveWaiter,
    RevokeLeases,
    SetFailure,
    SetState,
)

SWAP_TIMES_KEPT = 10


class _Keep(Enum):
    KEEP = "keep"


KEEP: Final = _Keep.KEEP
"""The field keeps its value (the default of every :func:`set_state` argument)."""
Keep = _Keep
"""The type of :data:`KEEP`, for decisions that pass it on."""

_TRUE = "1"
_EMPTY = ""


def set_state(
    *,
    phase: Phase | _Keep = KEEP,
    resident: str | _Keep | None = KEEP,
    target: str | _Keep | None = KEEP,
    from_member: str | _Keep | None = KEEP,
    epoch: int | _Keep = KEEP,
    owner: str | _Keep | None = KEEP,
    heartbeat_ms: int | _Keep = KEEP,
    started_ms: int | _Keep = KEEP,
    deadline_ms: int | _Keep = KEEP,
    committed_ms: int | _Keep = KEEP,
    forced: bool | _Keep = KEEP,
    parked: bool | _Keep = KEEP,
    unhealthy: bool | _Keep = KEEP,
    relearn_ms: int | _Keep | None = KEEP,
    rebuilt_epoch: int | _Keep = KEEP,
    closed: bool | _Keep = KEEP,
    closed_ms: int | _Keep | None = KEEP,
    previous: str | _Keep | None = KEEP,
    swap_id: str | _Keep | None = KEEP,
    cause: str | _Keep | None = KEEP,
    loading_ms: int | _Keep | None = KEEP,
    residents: frozenset[str] | _Keep = KEEP,
    evicts: tuple[str, ...] | _Keep = KEEP,
    also: tuple[str, ...] | _Keep = KEEP,
    unwell: frozenset[str] | _Keep = KEEP,
    closing: frozenset[str] | _Keep = KEEP,
    bump: bool = True,
) -> SetState:
    """A change of some fields of the pool state (named as :class:`PoolSnapshot` names
    them; ``None`` clears one); ``bump`` moves the state's ``version``."""
    values: dict[str, object] = {
        "phase": phase,
        "resident": resident,
        "target": target,
        "from": from_member,
        "epoch": epoch,
        "owner": owner,
        "heartbeat": heartbeat_ms,
        "started": started_ms,
        "deadline": deadline_ms,
        "committed": committed_ms,
        "forced": forced,
        "parked": parked,
        "unhealthy": unhealthy,
        "relearn": relearn_ms,
        "rebuilt": rebuilt_epoch,
        "closed": closed,
        "closedat": closed_ms,
        "previous": previous,
        "swap": swap_id,
        "cause": cause,
        "loading": loading_ms,
        "residents": KEEP if isinstance(residents, _Keep) else ",".join(sorted(residents)),
        "evicts": KEEP if isinstance(evicts, _Keep) else ",".join(evicts),
        "also": KEEP if isinstance(also, _Keep) else ",".join(also),
        "unwell": KEEP if isinstance(unwell, _Keep) else ",".join(sorted(unwell)),
        "closing": KEEP if isinstance(closing, _Keep) else ",".join(sorted(closing)),
    }
    fields = {name: _encode(value) for name, value in values.items() if value is not KEEP}
    return SetState(fields, bump=bump)


def used_field(member: str) -> str:
    """The state field that records when ``member`` was last loaded or used."""
    return f"{USED_PREFIX}{member}"


USED_PREFIX = "used."
LOADED_PREFIX = "loaded."
DEMAND_PREFIX = "demand."
DEMAND_AT_PREFIX = "demandat."
FAILED_PREFIX = "failed."


def _backoffs(state: Mapping[str, str], now_ms: int) -> dict[str, int]:
    """member -> milliseconds left of its swap-failure backoff (running ones only)."""
    left = {
        name.removeprefix(FAILED_PREFIX): int(deadline or 0) - now_ms
        for name, deadline in state.items()
        if name.startswith(FAILED_PREFIX)
    }
    return {m: ms for m, ms in left.items() if ms > 0}


def _members(text: str | None) -> tuple[str, ...]:
    return tuple(m for m in (text or "").split(",") if m)


def mark_used(member: str, now_ms: int) -> SetState:
    """Record that ``member`` was loaded or used just now (least recently used order)."""
    return SetState({used_field(member): str(now_ms)}, bump=False)


def mark_loaded(member: str, now_ms: int) -> SetState:
    """Record that ``member`` was loaded just now: used (least recently used order), and
    resident since (``minResidency`` before ``maxWait`` may close it)."""
    return SetState(
        {used_field(member): str(now_ms), f"{LOADED_PREFIX}{member}": str(now_ms)}, bump=False
    )


def owned_by(epoch: int, controller: str) -> Mapping[str, str]:
    """The state fields that say a swap is still ``controller``'s at ``epoch`` (a
    precondition of every step its owner takes)."""
    return {"epoch": str(epoch), "owner": controller}


def _encode(value: object) -> str:
    if value is None or value is False:
        return _EMPTY
    if value is True:
        return _TRUE
    if isinstance(value, Phase):
        return value.value
    return str(value)


def _lease_meta(op: AddLease) -> str:
    """The lease's record in ``lease-meta`` (the scripts read ``member`` and ``attempt``)."""
    return json.dumps(
        {
            "member": op.member,
            "attempt": op.attempt,
            "request_id": op.request_id,
            "router": op.router,
            "epoch": op.epoch,
        }
    )


def expired_lease_owner(meta: str) -> tuple[str | None, str | None]:
    """``(client request id, router)`` of an expired lease's record ("" when unknown)."""
    record = orjson.loads(meta) if meta else {}
    return record.get("request_id"), record.get("router")


def decode_snapshot(raw: Mapping[str, Any]) -> PoolSnapshot:
    """A :class:`PoolSnapshot` from the snapshot script's reply."""
    flat = raw.get("state") or []
    state = dict(zip(flat[::2], flat[1::2], strict=True)) if isinstance(flat, list) else {}
    members = _array(raw.get("members"))
    lease = raw.get("lease")
    stale = bool(raw.get("stale"))
    phase = Phase(state["phase"]) if state.get("phase") and not stale else Phase.UNKNOWN
    return PoolSnapshot(
        now_ms=int(raw["now"]),
        phase=phase,
        resident=state.get("resident") or None,
        target=state.get("target") or None,
        from_member=state.get("from") or None,
        epoch=int(state.get("epoch") or 0),
        version=int(state.get("version") or 0),
        owner=state.get("owner") or None,
        heartbeat_ms=int(state.get("heartbeat") or 0),
        started_ms=int(state.get("started") or 0),
        deadline_ms=int(state.get("deadline") or 0),
        committed_ms=int(state.get("committed") or 0),
        forced=bool(state.get("forced")),
        parked=bool(state.get("parked")),
        unhealthy=bool(state.get("unhealthy")),
        relearn_ms=int(state.get("relearn") or 0),
        rebuilt_epoch=int(state.get("rebuilt") or 0),
        closed=bool(state.get("closed")),
        closed_ms=int(state.get("closedat") or 0),
        previous=state.get("previous") or None,
        released_ms=int(state.get("released") or 0),
        swap_id=state.get("swap") or None,
        cause=state.get("cause") or None,
        loading_ms=int(state.get("loading") or 0),
        leases={m["name"]: int(m["leases"]) for m in members},
        waiters={m["name"]: int(m["waiters"]) for m in members},
        lease_expiry={
            m["name"]: int(float(m["expiry"])) for m in members if m.get("expiry") is not None
        },
        waiter_deadline={
            m["name"]: int(float(m["deadline"])) for m in members if m.get("deadline") is not None
        },
        failures=_backoffs(state, int(raw["now"])),
        swap_times=tuple(float(s) for s in _array(raw.get("swap_times"))),
        urgency={m["name"]: int(m["urgent"]) for m in members if m.get("urgent") is not None},
        member_swap_times={
            m["name"]: tuple(float(s) for s in _array(m.get("swap_times")))
            for m in members
            if _array(m.get("swap_times"))
        },
        member_drain_times={
            m["name"]: tuple(float(s) for s in _array(m.get("drain_times")))
            for m in members
            if _array(m.get("drain_times"))
        },
        member_request_times={
            m["name"]: tuple(float(s) for s in _array(m.get("request_times")))
            for m in members
            if _array(m.get("request_times"))
        },
        attempt_lease=(
            AttemptLease(
                member=lease["member"],
                lease_id=lease["id"],
                epoch=int(lease["epoch"]),
                expiry_ms=int(float(lease.get("expiry") or 0)),
            )
            if isinstance(lease, dict)
            else None
        ),
        attempt_waiting=any(int(m.get("waiting", 0)) for m in members),
        residents=frozenset(_members(state.get("residents"))),
        evicts=_members(state.get("evicts")),
        also=_members(state.get("also")),
        unwell=frozenset(_members(state.get("unwell"))),
        used={
            k.removeprefix(USED_PREFIX): int(v)
            for k, v in state.items()
            if k.startswith(USED_PREFIX) and v
        },
        loaded={
            k.removeprefix(LOADED_PREFIX): int(v)
            for k, v in state.items()
            if k.startswith(LOADED_PREFIX) and v
        },
        closing=frozenset(_members(state.get("closing"))),
        demand={
            k.removeprefix(DEMAND_PREFIX): (
                float(v),
                int(state.get(f"{DEMAND_AT_PREFIX}{k.removeprefix(DEMAND_PREFIX)}") or 0),
            )
            for k, v in state.items()
            if k.startswith(DEMAND_PREFIX) and v
        },
    )


def _array(value: object) -> list[Any]:
    """A Lua array from cjson, which encodes an empty one as ``{}``."""
    return value if isinstance(value, list) else []


@dataclass(frozen=True, slots=True)
class MemberKeys:
    name: str
    leases: str
    waiters: str
    urgency: str
    swap_times: str
    drain_times: str
    request_times: str


class PoolKeys:
    """Every key of one pool (names from :class:`hotseat_common.keys.Keys`); all share the
    pool's hash tag, so a script may touch them together on a Redis Cluster too."""

    def __init__(self, keys: Keys, pool: str, members: tuple[str, ...]) -> None:
        self.state = keys.pool_state(pool)
        self.lease_meta = keys.pool_lease_meta(pool)
        self.attempt_leases = keys.pool_attempt_leases(pool)
        self.swap_times = keys.pool_swap_times(pool)
        self.members = {
            m: MemberKeys(
                m,
                keys.pool_leases(pool, m),
                keys.pool_waiters(pool, m),
                keys.pool_waiter_urgency(pool, m),
                keys.pool_member_swap_times(pool, m),
                keys.pool_member_drain_times(pool, m),
                keys.pool_member_request_times(pool, m),
            )
            for m in members
        }
        self.all = [self.state, self.lease_meta, self.attempt_leases, self.swap_times]
        for m in self.members.values():
            self.all += [m.leases, m.waiters, m.urgency, m.swap_times]
            self.all += [m.drain_times, m.request_times]

    def member_specs(self) -> list[dict[str, str]]:
        """Each member's keys, as the scripts that take a JSON spec read them."""
        return [
            {
                "name": m.name,
                "leases": m.leases,
                "waiters": m.waiters,
                "urgency": m.urgency,
                "swap_times": m.swap_times,
                "drain_times": m.drain_times,
                "request_times": m.request_times,
            }
            for m in self.members.values()
        ]


def encode_pre(pre: Preconditions, keys: PoolKeys) -> dict[str, Any]:
    """The preconditions as the apply script checks them."""
    spec: dict[str, Any] = {
        "state_equals": dict(pre.state_equals),
        "zero_leases": [keys.members[m].leases for m in pre.zero_leases],
        "zero_waiters": [keys.members[m].waiters for m in pre.zero_waiters],
    }
    if pre.state_unknown:
        spec["state_unknown"] = True
    if pre.version is not None:
        spec["version"] = pre.version
    if pre.waiter_cap is not None:
        spec["waiter_cap"] = pre.waiter_cap
        spec["waiter_keys"] = [m.waiters for m in keys.members.values()]
    return spec


def encode_op(op: Op, keys: PoolKeys) -> dict[str, Any]:  # noqa: PLR0911 - one case per op kind
    """One write as the apply script performs it."""
    match op:
        case SetState(fields=fields, bump=bump):
            return {"op": "hset", "fields": dict(fields), "bump": bump}
        case AddLease():
            leases, meta = keys.members[op.member].leases, _lease_meta(op)
            return _op("lease", leases, expiry=op.expiry_ms, id=op.lease_id, meta=meta,
                       meta_key=keys.lease_meta, attempt_key=keys.attempt_leases,
                       attempt=op.attempt)  # fmt: skip
        case AddWaiter():
            m = keys.members[op.member]
            # A re-asked waiter keeps its first virtual arrival (it does not lose its age).
            return _op("wait", m.waiters, urgency_key=m.urgency, deadline=op.deadline_ms,
                       urgency=op.urgency_ms, member=op.attempt)  # fmt: skip
        case RemoveWaiter():
            m = keys.members[op.member]
            return _op("unwait", m.waiters, urgency_key=m.urgency, member=op.attempt)
        case ClearWaiters():
            m = keys.members[op.member]
            return _op("unwait_all", m.waiters, urgency_key=m.urgency)
        case SetFailure():
            return _op("backoff", keys.state, field=f"{FAILED_PREFIX}{op.member}", ms=op.ttl_ms)
        case RecordSwapTime() | RecordDrainTime():
            lists = _duration_lists(op, keys)
            return _op("swap_time", lists[0], keys=lists, value=f"{op.seconds:.3f}",
                       keep=SWAP_TIMES_KEPT)  # fmt: skip
        case RevokeLeases():
            leases = keys.members[op.member].leases
            return _op("revoke", leases, meta_key=keys.lease_meta, attempt_key=keys.attempt_leases)


def _duration_lists(op: RecordSwapTime | RecordDrainTime, keys: PoolKeys) -> list[str]:
    """The lists of recent durations a measurement goes to: a swap's to the pool's and its
    target's, a drain's to its member's."""
    if isinstance(op, RecordDrainTime):
        return [keys.members[op.member].drain_times]
    if op.member is None:
        return [keys.swap_times]
    return [keys.swap_times, keys.members[op.member].swap_times]


def _op(name: str, key: str, **fields: object) -> dict[str, Any]:
    return {"op": name, "key": key, **fields}
