"""The group index of one model group (docs/adr/0012): read in one round trip, claimed
with a compare on its version, and kept by the placement's grants, waits, renewals and
releases and by the pool supervisors' copy entries.

Every key is in the group's ``{group:<name>}`` hash tag and declared in each script's
``KEYS``; every script runs a fixed number of commands, whatever the number of pools.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass

import orjson

from hotseat_common.keys import Keys
from hotseat_pool_controller.decisions.placement import CopyState, GroupSnapshot
from hotseat_pool_controller.store.link import LuaScript, RedisLink
from hotseat_pool_controller.store.scripts import NOW as _NOW

_COUNT = """
-- KEYS[1]: a ZSET of '<pool> <id>' entries; its expired entries go, the live ones are
-- counted per pool in 'count'.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local count = {}
for _, e in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local p = string.sub(e, 1, string.find(e, ' ', 1, true) - 1)
  count[p] = (count[p] or 0) + 1
end
"""

READ = LuaScript(
    _NOW
    + """
-- KEYS: copies, leases, waiting, claims, version, session (or a dummy), busy
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', now)
local session = false
if ARGV[1] == '1' then session = redis.call('GET', KEYS[6]) end
return {now, redis.call('HGETALL', KEYS[1]), redis.call('ZRANGE', KEYS[2], 0, -1),
        redis.call('ZRANGE', KEYS[3], 0, -1), redis.call('HGETALL', KEYS[4]),
        redis.call('GET', KEYS[5]) or '0', session, redis.call('ZRANGE', KEYS[7], 0, -1)}
"""
)

CLAIM = LuaScript(
    _NOW
    + """
-- KEYS: version, claims, waiting. ARGV: the version read, pool, how long the claim
-- lasts (ms), attempt, ms its reservation lasts. The claiming request is counted as the
-- new copy's first waiter at once ('<pool> ~<attempt>', as a join counts).
if (redis.call('GET', KEYS[1]) or '0') ~= ARGV[1] then return 0 end
redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], ARGV[2], now + tonumber(ARGV[3]))
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[5]), ARGV[2] .. ' ~' .. ARGV[4])
return 1
"""
)

TAKE = LuaScript(
    _NOW
    + """
-- KEYS: leases. ARGV: attempt, ms the reservation lasts, '1': only a copy with a free
-- slot, the preferred pool ('' : none), then pool, slots pairs in the pools' name order.
-- Counts the live leases (and reservations) per pool, chooses as decide_placement does
-- (fewest leases, then most slots free; with no room: least over its slots; then the
-- name), and reserves a lease entry '<pool> ~<attempt>' for the request.
"""
    + _COUNT
    + """
local room = ARGV[3] == '1'
local best, k1, k2 = false, 0, 0
for i = 5, #ARGV - 1, 2 do  -- the last argument is the clock
  local p, s = ARGV[i], tonumber(ARGV[i + 1])
  local n = count[p] or 0
  if p == ARGV[4] and n < s then best = p; break end
  if not room or n < s then
    local a, b = n, n - s
    if not room then a, b = n - s, 0 end
    if not best or a < k1 or (a == k1 and b < k2) then best, k1, k2 = p, a, b end
  end
end
if best then redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), best .. ' ~' .. ARGV[1]) end
return best
"""
)

JOIN = LuaScript(
    _NOW
    + """
-- KEYS: waiting. ARGV: attempt, ms the reservation lasts, then pool, slots pairs of the
-- loading copies in the pools' name order. Counts the live waiters (and reservations)
-- per pool, chooses the copy with the fewest among those with fewer than its slots (then
-- the name), and reserves a waiter entry '<pool> ~<attempt>' for the request; false when
-- every copy has its slots.
"""
    + _COUNT
    + """
local best, least = false, 0
for i = 3, #ARGV - 1, 2 do  -- the last argument is the clock
  local p, s = ARGV[i], tonumber(ARGV[i + 1])
  local n = count[p] or 0
  if n < s and (not best or n < least) then best, least = p, n end
end
if best then redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), best .. ' ~' .. ARGV[1]) end
return best
"""
)

RECORD = LuaScript(
    _NOW
    + """
-- KEYS: leases, waiting, session (or a dummy), last. ARGV: pool, attempt, lease id (''
-- while held or refused), ms the lease or the hold lasts (0: refused), session TTL ms
-- (0: no session), the placement's reason. The attempt's reservation (take or join)
-- ends in every case; a grant or a hold is the group's last placement.
local waiter = ARGV[1] .. ' ' .. ARGV[2]
redis.call('ZREM', KEYS[1], ARGV[1] .. ' ~' .. ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[1] .. ' ~' .. ARGV[2])
if tonumber(ARGV[4]) > 0 then
  redis.call('SET', KEYS[4], cjson.encode({pool = ARGV[1], reason = ARGV[6], at = now}))
end
if ARGV[3] ~= '' then
  redis.call('ZREM', KEYS[2], waiter)
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), ARGV[1] .. ' ' .. ARGV[3])
  if tonumber(ARGV[5]) > 0 then redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[5]) end
elseif tonumber(ARGV[4]) > 0 then
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), waiter)
end
return 1
"""
)

BUSY = LuaScript(
    _NOW
    + """
-- KEYS: busy. ARGV: pool, lease id, ms the lease lasts ('' : the lease ends). A lease on
-- another member of the pool, counted until it ends or expires (a renewal adds it again:
-- a lease the pool's store adopted, or one whose grant was counted before this existed).
local entry = ARGV[1] .. ' ' .. ARGV[2]
if ARGV[3] == '' then return redis.call('ZREM', KEYS[1], entry) end
return redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), entry)
"""
)

TOUCH = LuaScript(
    _NOW
    + """
-- KEYS: leases. ARGV: pool, lease id, ms the lease lasts ('' : the lease ends)
local entry = ARGV[1] .. ' ' .. ARGV[2]
if ARGV[3] == '' then return redis.call('ZREM', KEYS[1], entry) end
return redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[3]), entry)
"""
)


def _copy_json(state: CopyState) -> bytes:
    return orjson.dumps({
        "r": state.resident,
        "l": state.loading,
        "p": state.placeable,
        "c": state.cost_s,
        "u": state.unused_ms,
        "w": state.wait_s,
        "f": state.failed,
        "t": state.at_ms,
        "s": state.sole,
    })  # fmt: skip


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _copy_of(raw: bytes | str) -> CopyState:
    d = orjson.loads(raw)
    return CopyState(
        resident=bool(d["r"]),
        loading=bool(d["l"]),
        placeable=bool(d["p"]),
        cost_s=int(d["c"]),
        unused_ms=int(d["u"]),
        wait_s=float(d["w"]),
        failed=bool(d["f"]),
        at_ms=int(d["t"]),
        sole=bool(d.get("s", False)),
    )


def _pairs(flat: list[bytes | str]) -> list[tuple[str, bytes | str]]:
    return [(_text(flat[i]), flat[i + 1]) for i in range(0, len(flat), 2)]


def _per_pool(entries: list[bytes | str]) -> dict[str, int]:
    """``<pool> <id>`` entries counted per pool."""
    return dict(Counter(_text(e).split(" ", 1)[0] for e in entries))


@dataclass(frozen=True, slots=True)
class GroupStore:
    link: RedisLink
    keys: Keys
    group: str

    def _session_key(self, session: str | None) -> str:
        # Client text never becomes a key as such: hashed, it is bounded and safe.
        digest = hashlib.sha256((session or "").encode()).hexdigest()[:32]
        return self.keys.group_session(self.group, digest)

    async def read(self, session: str | None = None) -> GroupSnapshot:
        k, g = self.keys, self.group
        now, copies, leases, waiting, claims, version, pool, busy = await self.link.script(
            READ,
            keys=[
                k.group_copies(g),
                k.group_leases(g),
                k.group_waiting(g),
                k.group_claims(g),
                k.group_version(g),
                self._session_key(session),
                k.group_busy(g),
            ],
            args=["1" if session else "0"],
        )
        return GroupSnapshot(
            now_ms=int(now),
            copies={p: _copy_of(raw) for p, raw in _pairs(copies)},
            leases=_per_pool(leases),
            waiting=_per_pool(waiting),
            claims={p: int(raw) for p, raw in _pairs(claims)},
            session_pool=_text(pool) if pool else None,
            version=int(version),
            busy=_per_pool(busy),
        )

    async def claim(
        self, pool: str, version: int, ttl_ms: int, *, attempt: str, reserve_ms: int
    ) -> bool:
        """Start a copy on ``pool`` if no other placement claimed since ``version``, and
        count the claiming request as its waiter (a reservation, as :meth:`join`)."""
        k, g = self.keys, self.group
        done = await self.link.script(
            CLAIM,
            keys=[k.group_version(g), k.group_claims(g), k.group_waiting(g)],
            args=[version, pool, ttl_ms, attempt, reserve_ms],
        )
        return bool(done)

    async def take(
        self,
        attempt: str,
        copies: list[tuple[str, int]],
        *,
        room: bool,
        prefer: str | None,
        reserve_ms: int,
    ) -> str | None:
        """Choose among the resident ``copies`` (pool, slots) from the live counts and
        count the request there (a reservation until its grant is recorded, or for
        ``reserve_ms``) in one script; ``None``: none has room any more."""
        args: list[str | int] = [attempt, reserve_ms, "1" if room else "0", prefer or ""]
        for pool, slots in sorted(copies):
            args += [pool, slots]
        taken = await self.link.script(TAKE, keys=[self.keys.group_leases(self.group)], args=args)
        return _text(taken) if taken else None

    async def join(
        self, attempt: str, copies: list[tuple[str, int]], *, reserve_ms: int
    ) -> str | None:
        """Choose among the loading ``copies`` (pool, slots) the one with the fewest live
        waiters below its slots, and count the request there as a waiter (a reservation
        until its hold or grant is recorded, or for ``reserve_ms``) in one script;
        ``None``: every one has its slots of waiters."""
        args: list[str | int] = [attempt, reserve_ms]
        for pool, slots in sorted(copies):
            args += [pool, slots]
        joined = await self.link.script(JOIN, keys=[self.keys.group_waiting(self.group)], args=args)
        return _text(joined) if joined else None

    async def record(
        self,
        pool: str,
        attempt: str,
        *,
        lease_id: str | None,
        ttl_ms: int,
        session: str | None,
        session_ttl_ms: int,
        reason: str = "",
    ) -> None:
        """A grant (the lease counted, the session remembered), a hold (the waiter
        counted until ``ttl_ms``) or a refusal (``ttl_ms`` 0: nothing counted); the
        attempt's reservation ends in every case."""
        k, g = self.keys, self.group
        await self.link.script(
            RECORD,
            keys=[
                k.group_leases(g),
                k.group_waiting(g),
                self._session_key(session),
                k.group_last(g),
            ],
            args=[
                pool,
                attempt,
                lease_id or "",
                ttl_ms,
                session_ttl_ms if session else 0,
                reason,
            ],
        )

    async def last(self) -> tuple[str, str, int] | None:
        """The group's last placement: (pool, reason, when in ms), for status."""
        raw = await self.link.execute("GET", self.keys.group_last(self.group))
        if not raw:
            return None
        d = orjson.loads(raw)
        return str(d["pool"]), str(d["reason"]), int(d["at"])

    async def touch(self, pool: str, lease_id: str, ttl_ms: int | None) -> None:
        """A renewal (``ttl_ms``) or a release (``None``) of a lease placed by the group."""
        await self.link.script(
            TOUCH,
            keys=[self.keys.group_leases(self.group)],
            args=[pool, lease_id, "" if ttl_ms is None else ttl_ms],
        )

    async def busy(self, pool: str, lease_id: str, ttl_ms: int | None) -> None:
        """A lease on another member of ``pool`` (one-resident) is granted or renewed for
        ``ttl_ms`` (``None``: it ended): while it lives, the group's copy there is not
        placeable, whatever its entry says (docs/adr/0012, "Busy residents")."""
        await self.link.script(
            BUSY,
            keys=[self.keys.group_busy(self.group)],
            args=[pool, lease_id, "" if ttl_ms is None else ttl_ms],
        )

    async def forget_waiter(self, pool: str, attempt: str) -> None:
        await self.link.execute("ZREM", self.keys.group_waiting(self.group), f"{pool} {attempt}")

    async def write_copy(self, pool: str, state: CopyState) -> None:
        await self.link.execute("HSET", self.keys.group_copies(self.group), pool, _copy_json(state))
