"""The pool store: reads one pool's state in one round trip, applies a decision with one
compare-and-apply script, and runs the lease scripts (renew, release, cancel, reap).

It applies and reports; it decides nothing: every answer comes from a pure decision
(:mod:`hotseat_pool_controller.decisions`), every field and key name from
:mod:`.codec`, every script from :mod:`.scripts`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

import orjson

from hotseat_common.keys import Keys
from hotseat_common.messages import Granted
from hotseat_pool_controller.model import Decision, Phase, PoolPolicy, PoolSnapshot
from hotseat_pool_controller.store import scripts
from hotseat_pool_controller.store.codec import (
    SWAP_TIMES_KEPT,
    PoolKeys,
    decode_snapshot,
    encode_op,
    encode_pre,
    expired_lease_owner,
)
from hotseat_pool_controller.store.link import LuaScript, RedisLink

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
    last: bool = False
    """No live lease is left on the member."""


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


def _request_time(policy: PoolPolicy, longest_s: float | None) -> str:
    """A released lease's longest request, as the release script keeps it: only for a pool
    with ``maxWait`` (nothing else reads it; no write on the hot path otherwise)."""
    if policy.max_wait_ms is None or longest_s is None:
        return ""
    return f"{longest_s:.3f}"


class PoolStore:
    def __init__(self, link: RedisLink, keys: Keys, policy: PoolPolicy) -> None:
        self.link = link
        self.keys = keys
        self.policy = policy
        self._keys = PoolKeys(keys, policy.name, policy.members)
        self._snapshot = LuaScript(scripts.SNAPSHOT)
        self._apply = LuaScript(scripts.APPLY)
        self._renew = LuaScript(scripts.RENEW)
        self._release = LuaScript(scripts.RELEASE)
        self._reap = LuaScript(scripts.REAP)
        self._grant_fast = LuaScript(scripts.GRANT_FAST)
        self._cancel = LuaScript(scripts.CANCEL)
        self.surplus: Callable[[], frozenset[str]] = frozenset
        """This pool's members that are copies beyond demand now (docs/adr/0012): set
        by the placement wiring when model groups serve on the pool."""

    # --- reads --------------------------------------------------------------------

    def _read_spec(self, attempt: str = "", *, deadlines: bool = False) -> dict[str, Any]:
        """What a read of the pool reads (scripts._READ)."""
        k = self._keys
        return {
            "state": k.state,
            "deadlines": deadlines,
            "members": k.member_specs(),
            "attempt": attempt,
            "attempt_leases": k.attempt_leases,
            "lease_meta": k.lease_meta,
            "lease_keys": {m.name: m.leases for m in k.members.values()},
            "swap_times": k.swap_times,
        }

    def _decoded(self, raw: str | bytes) -> PoolSnapshot:
        snap = decode_snapshot(orjson.loads(raw))
        surplus = self.surplus()
        return replace(snap, surplus=surplus) if surplus else snap

    async def snapshot(self, attempt: str = "", *, deadlines: bool = False) -> PoolSnapshot:
        """The pool, and (``attempt`` given) whether that attempt waits or holds a lease;
        ``deadlines``: each member's first lease expiry and waiter deadline too."""
        spec = self._read_spec(attempt, deadlines=deadlines)
        raw = await self.link.script(
            self._snapshot, keys=self._keys.all, args=[orjson.dumps(spec)], identified=True
        )
        return self._decoded(raw)

    # --- decisions ----------------------------------------------------------------

    async def apply(self, decision: Decision) -> Applied:
        applied, _ = await self.commit(decision)
        return applied

    async def commit(self, decision: Decision) -> tuple[Applied, PoolSnapshot | None]:
        """Apply the decision's writes if its preconditions hold. A decision that changes
        the state (``changes_state``) and was applied comes back with the pool as its
        writes left it, read by the same script: the state the store holds at its commit,
        whatever other replicas do after (``None`` for any other decision, or one not
        applied)."""
        if not decision.ops:
            return Applied.OK, None
        spec: dict[str, Any] = {
            "state": self._keys.state,
            "pre": encode_pre(decision.pre, self._keys),
            "ops": [encode_op(op, self._keys) for op in decision.ops],
        }
        if decision.changes_state:
            spec["read"] = self._read_spec()
        result = await self.link.script(
            self._apply, keys=self._keys.all, args=[orjson.dumps(spec)], identified=True
        )
        if isinstance(result, str | bytes):
            return Applied.OK, self._decoded(result)
        return Applied(int(result)), None

    async def decide(
        self, decide: Callable[[PoolSnapshot], Decision], attempt: str = ""
    ) -> tuple[Decision, PoolSnapshot | None]:
        """Snapshot, decide, apply; again from a fresh snapshot while a precondition broke.
        A decision whose waiter cap was reached meanwhile is answered as it said
        (``pre.over_cap``). Returns the decision applied and, when it changed the state,
        the pool as its commit left it (:meth:`commit`; ``None`` otherwise)."""
        for _ in range(MAX_ATTEMPTS):
            snap = await self.snapshot(attempt)
            decision = decide(snap)
            applied, after = await self.commit(decision)
            if applied is Applied.OK:
                return decision, after
            if applied is Applied.QUEUE_FULL:
                return Decision(reply=decision.pre.over_cap), None
        raise ConflictError(f"pool {self.policy.name}: decision lost {MAX_ATTEMPTS} races")

    async def grant_if_resident(
        self, member: str, lease_id: str, attempt: str, router: str, *, request_id: str = ""
    ) -> Granted | None:
        """One round trip for the common case (see scripts.GRANT_FAST); None: not applicable."""
        m = self._keys.members.get(member)
        if m is None:
            return None
        k = self._keys
        result = await self.link.script(
            self._grant_fast,
            keys=[
                k.state,
                m.leases,
                k.lease_meta,
                k.attempt_leases,
                m.waiters,
                m.urgency,
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
        longest_s: float | None = None,
    ) -> Renewed:
        """Extend a live lease; write back one the store forgot while it relearns (the
        epoch, attempt and router say whose it was); see scripts.RENEW. ``longest_s``:
        the longest request that ended on it since its last renewal, kept as the member's
        recent request times when the pool has ``maxWait``."""
        m = self._keys.members.get(member)
        if m is None:
            return Renewed(Renewal.GONE)
        k = self._keys
        result = await self.link.script(
            self._renew,
            keys=[m.leases, k.state, k.lease_meta, k.attempt_leases, m.request_times],
            args=[
                lease_id,
                self.policy.lease_ttl_ms,
                member,
                epoch,
                attempt,
                request_id,
                router,
                _request_time(self.policy, longest_s),
                SWAP_TIMES_KEPT,
            ],
            identified=True,
        )
        outcome = Renewal(int(result[0]))
        return Renewed(outcome, shareable=outcome is not Renewal.RENEWED or bool(int(result[1])))

    async def release(
        self, member: str, lease_id: str, requests: int = 1, longest_s: float | None = None
    ) -> Released:
        """The lease ends (``requests``: how many requests used it, counted as the
        member's recent demand in a capacity pool; ``longest_s``: the longest of them,
        kept as the member's recent request times when the pool has ``maxWait``)."""
        m = self._keys.members.get(member)
        if m is None:
            return Released(removed=False, may_move=False)
        k = self._keys
        others = [o.waiters for o in k.members.values() if o.name != member]
        removed, left, phase, waiters, unhealthy = await self.link.script(
            self._release,
            keys=[m.leases, k.lease_meta, k.attempt_leases, k.state, m.request_times, *others],
            args=[
                lease_id,
                member,
                requests,
                self.policy.demand_half_life_ms,
                _request_time(self.policy, longest_s),
                SWAP_TIMES_KEPT,
            ],
        )
        # Only the last lease of a member the pool is draining away from, one that other
        # members' requests wait behind, or one on an unhealthy resident (now it can be
        # recovered) can let the pool move; other releases need no supervisor tick.
        may_move = int(left) == 0 and (
            phase == Phase.DRAINING.value or int(waiters) > 0 or bool(unhealthy)
        )
        return Released(removed=bool(removed), may_move=may_move, last=int(left) == 0)

    async def cancel(self, member: str, attempt: str) -> bool:
        """``attempt`` gives up on ``member``: its waiter there and its lease on it go."""
        m = self._keys.members.get(member)
        if m is None:
            return False
        k = self._keys
        removed = await self.link.script(
            self._cancel,
            keys=[m.waiters, k.attempt_leases, k.lease_meta, m.leases, m.urgency],
            args=[attempt, member],
        )
        return bool(removed)

    async def reap(self) -> list[ExpiredLease]:
        """Remove expired leases (returned, to be audited) and expired waiters."""
        k = self._keys
        spec = {
            "members": k.member_specs(),
            "lease_meta": k.lease_meta,
            "attempt_leases": k.attempt_leases,
        }
        raw = await self.link.script(self._reap, keys=k.all, args=[orjson.dumps(spec)])
        expired: list[ExpiredLease] = []
        for item in orjson.loads(raw):
            request_id, router = expired_lease_owner(item.get("meta") or "")
            expired.append(
                ExpiredLease(
                    lease_id=item["id"], member=item["member"], request_id=request_id, router=router
                )
            )
        return expired

    async def reset(self) -> None:
        """Delete every key of this pool (tests and ``unload`` of a broken pool)."""
        await self.link.execute("DEL", *self._keys.all)
