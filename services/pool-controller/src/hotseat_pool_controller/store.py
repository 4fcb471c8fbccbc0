"""The one module that reads and writes pool state in Redis.

Reads are one snapshot script; writes apply a pure :class:`~.state.Decision` with one
compare-and-apply script that checks the decision's preconditions first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson

from hotseat_common.errors import ErrorCode
from hotseat_common.keys import Keys
from hotseat_common.messages import ErrorReply, Granted, PoolView
from hotseat_pool_controller import scripts
from hotseat_pool_controller.redis_link import LuaScript, RedisLink
from hotseat_pool_controller.state import (
    AddLease,
    AddWaiter,
    AttemptLease,
    ClearWaiters,
    Decision,
    Op,
    Phase,
    PoolPolicy,
    PoolSnapshot,
    RecordSwapTime,
    RemoveWaiter,
    RevokeLeases,
    SetFailure,
    SetState,
    retry_after_s,
)

SWAP_TIMES_KEPT = 10
MAX_ATTEMPTS = 50


class Applied(Enum):
    OK = 1
    CONFLICT = 0
    QUEUE_FULL = -1


@dataclass(frozen=True, slots=True)
class Released:
    removed: bool
    may_move: bool
    """The release can let the pool move (drain finished, waiters left)."""


@dataclass(frozen=True, slots=True)
class ExpiredLease:
    lease_id: str
    member: str
    request_id: str | None
    router: str | None


class Renewal(Enum):
    RENEWED = 1
    GONE = 0
    UNKNOWN = -1
    """The store cannot tell (its state is unknown, a rebuild is due): not a refusal."""


@dataclass(frozen=True, slots=True)
class Renewed:
    outcome: Renewal
    shareable: bool = True


class ConflictError(RuntimeError):
    """A decision kept losing races; should not happen outside pathological contention."""


class PoolStore:
    def __init__(self, link: RedisLink, keys: Keys, policy: PoolPolicy) -> None:
        self.link = link
        self.keys = keys
        self.policy = policy
        pool = policy.name
        self._state = keys.pool_state(pool)
        self._lease_meta = keys.pool_lease_meta(pool)
        self._attempt_leases = keys.pool_attempt_leases(pool)
        self._swap_times = keys.pool_swap_times(pool)
        self._member_keys = [
            {
                "name": m,
                "leases": keys.pool_leases(pool, m),
                "waiters": keys.pool_waiters(pool, m),
                "failure": keys.pool_failure(pool, m),
            }
            for m in policy.members
        ]
        self._lease_keys = {m: keys.pool_leases(pool, m) for m in policy.members}
        # Every key of the pool, declared as KEYS to the scripts that take their key names
        # in a JSON spec: a script touches only declared keys (Redis Cluster's rule, and
        # what proxies that route by KEYS rely on); all share the pool's hash tag.
        self._all_keys = [self._state, self._lease_meta, self._attempt_leases, self._swap_times]
        for member in self._member_keys:
            self._all_keys += [member["leases"], member["waiters"], member["failure"]]
        self._snapshot = LuaScript(scripts.SNAPSHOT)
        self._apply = LuaScript(scripts.APPLY)
        self._renew = LuaScript(scripts.RENEW)
        self._release = LuaScript(scripts.RELEASE)
        self._reap = LuaScript(scripts.REAP)
        self._grant_fast = LuaScript(scripts.GRANT_FAST)
        self._cancel = LuaScript(scripts.CANCEL)

    # --- reads --------------------------------------------------------------------

    async def snapshot(self, attempt: str = "") -> PoolSnapshot:
        """The pool, and (``attempt`` given) whether that attempt waits or holds a lease."""
        spec = {
            "state": self._state,
            "members": self._member_keys,
            "attempt": attempt,
            "attempt_leases": self._attempt_leases,
            "lease_meta": self._lease_meta,
            "lease_keys": self._lease_keys,
            "swap_times": self._swap_times,
        }
        raw = await self.link.script(
            self._snapshot, keys=self._all_keys, args=[orjson.dumps(spec)], identified=True
        )
        return _parse_snapshot(orjson.loads(raw))

    async def view(self) -> PoolView:
        snap = await self.snapshot()
        return PoolView(
            name=self.policy.name,
            resident=snap.resident,
            swapping=snap.target,
            phase=snap.phase.value,
            epoch=snap.epoch,
            leases={m: snap.live_leases(m) for m in self.policy.members},
            waiters={m: snap.live_waiters(m) for m in self.policy.members},
            unhealthy=snap.unhealthy,
            relearning=snap.relearning,
        )

    # --- decisions ----------------------------------------------------------------

    async def apply(self, decision: Decision) -> Applied:
        if not decision.ops:
            return Applied.OK
        pre = decision.pre
        pre_spec: dict[str, Any] = {
            "state_equals": dict(pre.state_equals),
            "zero_leases": [self._lease_keys[m] for m in pre.zero_leases],
            "zero_waiters": [self.keys.pool_waiters(self.policy.name, m) for m in pre.zero_waiters],
        }
        if pre.state_unknown:
            pre_spec["state_unknown"] = True
        if pre.version is not None:
            pre_spec["version"] = pre.version
        if pre.waiter_cap is not None:
            pre_spec["waiter_cap"] = pre.waiter_cap
            pre_spec["waiter_keys"] = [m["waiters"] for m in self._member_keys]
        spec = {
            "state": self._state,
            "pre": pre_spec,
            "ops": [self._encode(op) for op in decision.ops],
        }
        result = await self.link.script(
            self._apply, keys=self._all_keys, args=[orjson.dumps(spec)], identified=True
        )
        return Applied(int(result))

    async def decide(
        self, decide: Callable[[PoolSnapshot], Decision], attempt: str = ""
    ) -> tuple[Decision, PoolSnapshot]:
        """Snapshot, decide, apply; again from a fresh snapshot while a precondition broke."""
        for _ in range(MAX_ATTEMPTS):
            snap = await self.snapshot(attempt)
            decision = decide(snap)
            applied = await self.apply(decision)
            if applied is Applied.OK:
                return decision, snap
            if applied is Applied.QUEUE_FULL:
                full = ErrorReply(
                    code=ErrorCode.POOL_QUEUE_FULL,
                    message=f"pool {self.policy.name} holds maxWaiters requests",
                    retry_after_s=retry_after_s(snap),
                )
                return Decision(reply=full), snap
        raise ConflictError(f"pool {self.policy.name}: decision lost {MAX_ATTEMPTS} races")

    def _encode(self, op: Op) -> dict[str, Any]:  # noqa: PLR0911 - one case per op kind
        pool = self.policy.name
        match op:
            case SetState(fields=fields, bump=bump):
                return {"op": "hset", "fields": dict(fields), "bump": bump}
            case AddLease():
                return {
                    "op": "lease",
                    "key": self._lease_keys[op.member],
                    "expiry": op.expiry_ms,
                    "id": op.lease_id,
                    "meta_key": self._lease_meta,
                    "meta": op.meta,
                    "attempt_key": self._attempt_leases,
                    "attempt": op.attempt,
                }
            case AddWaiter():
                return {
                    "op": "zadd",
                    "key": self.keys.pool_waiters(pool, op.member),
                    "score": op.deadline_ms,
                    "member": op.attempt,
                }
            case RemoveWaiter():
                return {
                    "op": "zrem",
                    "key": self.keys.pool_waiters(pool, op.member),
                    "member": op.attempt,
                }
            case ClearWaiters():
                return {"op": "del", "key": self.keys.pool_waiters(pool, op.member)}
            case SetFailure():
                return {
                    "op": "setpx",
                    "key": self.keys.pool_failure(pool, op.member),
                    "value": op.reason,
                    "px": op.ttl_ms,
                }
            case RecordSwapTime():
                return {
                    "op": "lpush_trim",
                    "key": self._swap_times,
                    "value": f"{op.seconds:.3f}",
                    "keep": SWAP_TIMES_KEPT,
                }
            case RevokeLeases():
                return {
                    "op": "revoke",
                    "key": self._lease_keys[op.member],
                    "meta_key": self._lease_meta,
                    "attempt_key": self._attempt_leases,
                }

    async def grant_if_resident(
        self, member: str, lease_id: str, attempt: str, router: str, *, request_id: str = ""
    ) -> Granted | None:
        """One round trip for the common case (see scripts.GRANT_FAST); None: not applicable."""
        key = self._lease_keys.get(member)
        if key is None:
            return None
        pool = self.policy.name
        result = await self.link.script(
            self._grant_fast,
            keys=[
                self._state,
                key,
                self._lease_meta,
                self._attempt_leases,
                self.keys.pool_waiters(pool, member),
                self.keys.pool_failure(pool, member),
            ],
            args=[member, lease_id, self.policy.lease_ttl_ms, attempt, router, request_id],
            identified=True,
        )
        if int(result[0]) != 1:
            return None
        return Granted(
            lease_id=lease_id, ttl_s=self.policy.lease_ttl_ms / 1000, epoch=int(result[1])
        )

    # --- leases and waiters ---------------------------------------------------------

    async def renew(
        self,
        member: str,
        lease_id: str,
        *,
        epoch: int = 0,
        attempt: str = "",
        request_id: str = "",
        router: str = "",
    ) -> Renewed:
        """Extend a live lease; write back one the store forgot while it relearns (the
        epoch, attempt and router say whose it was); see scripts.RENEW."""
        key = self._lease_keys.get(member)
        if key is None:
            return Renewed(Renewal.GONE)
        result = await self.link.script(
            self._renew,
            keys=[key, self._state, self._lease_meta, self._attempt_leases],
            args=[lease_id, self.policy.lease_ttl_ms, member, epoch, attempt, request_id, router],
            identified=True,
        )
        outcome = Renewal(int(result[0]))
        return Renewed(outcome, shareable=outcome is not Renewal.RENEWED or bool(int(result[1])))

    async def release(self, member: str, lease_id: str) -> Released:
        key = self._lease_keys.get(member)
        if key is None:
            return Released(removed=False, may_move=False)
        removed, left, phase, waiters, unhealthy = await self.link.script(
            self._release,
            keys=[
                key,
                self._lease_meta,
                self._attempt_leases,
                self._state,
                *(m["waiters"] for m in self._member_keys if m["name"] != member),
            ],
            args=[lease_id],
        )
        # Only the last lease of a member the pool is draining away from, one that other
        # members' requests wait behind, or one on an unhealthy resident (now it can be
        # recovered) can let the pool move; other releases need no supervisor tick.
        may_move = int(left) == 0 and (
            phase == Phase.DRAINING.value or int(waiters) > 0 or bool(unhealthy)
        )
        return Released(removed=bool(removed), may_move=may_move)

    async def cancel(self, member: str, attempt: str) -> bool:
        """``attempt`` gives up on ``member``: its waiter there and its lease on it go."""
        key = self._lease_keys.get(member)
        if key is None:
            return False
        removed = await self.link.script(
            self._cancel,
            keys=[
                self.keys.pool_waiters(self.policy.name, member),
                self._attempt_leases,
                self._lease_meta,
                key,
            ],
            args=[attempt, member],
        )
        return bool(removed)

    async def reap(self) -> list[ExpiredLease]:
        """Remove expired leases (returned, to be audited) and expired waiters."""
        spec = {
            "members": self._member_keys,
            "lease_meta": self._lease_meta,
            "attempt_leases": self._attempt_leases,
        }
        raw = await self.link.script(self._reap, keys=self._all_keys, args=[orjson.dumps(spec)])
        expired: list[ExpiredLease] = []
        for item in orjson.loads(raw):
            meta = orjson.loads(item["meta"]) if item.get("meta") else {}
            expired.append(
                ExpiredLease(
                    lease_id=item["id"],
                    member=item["member"],
                    request_id=meta.get("request_id"),
                    router=meta.get("router"),
                )
            )
        return expired

    async def reset(self) -> None:
        """Delete every key of this pool (tests and ``unload`` of a broken pool)."""
        await self.link.execute("DEL", *self._all_keys)


def _parse_snapshot(raw: dict[str, Any]) -> PoolSnapshot:
    flat = raw.get("state") or []
    state = dict(zip(flat[::2], flat[1::2], strict=True)) if isinstance(flat, list) else {}
    members = raw.get("members") or []
    if isinstance(members, dict):  # cjson encodes an empty array as {}
        members = []
    lease = raw.get("lease")
    swap_times = raw.get("swap_times") or []
    if isinstance(swap_times, dict):
        swap_times = []
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
        leases={m["name"]: int(m["leases"]) for m in members},
        waiters={m["name"]: int(m["waiters"]) for m in members},
        failures={m["name"]: int(m["failure"]) for m in members if int(m["failure"]) > 0},
        swap_times=tuple(float(s) for s in swap_times),
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
    )
