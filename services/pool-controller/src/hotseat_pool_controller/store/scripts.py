"""Lua scripts the store runs in Redis. Key names are passed in from :mod:`hotseat_common.keys`;
all times come from the store's clock (:data:`NOW`): Redis ``TIME``, so every replica
shares one clock.

Scripts that read or write the pool state are called ``identified``: their last argument is
the ``run_id`` of the server they run on, and the state hash records the ``store`` it was
written on. A state written on another server (a restart, a failover to a replica that may
lag) is *stale*: the snapshot reports it as unknown and nothing but a rebuild may write it.
"""

from __future__ import annotations

NOW = """
-- The store's clock, in ms: Redis TIME, unless the call's last argument is a time (the
-- link's clock, a test's virtual one; in service that argument is empty).
local now = tonumber(ARGV[#ARGV])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""
"""Where every script's ``now`` comes from, defined once: the last argument of every
script call is the link's clock (:meth:`RedisLink.script`), empty in service."""

_NOW = (
    NOW
    + """
local since = '(' .. now
"""
)

_READ = """
-- The pool as it is now: its state hash, and each member's live leases and waiters
-- (``spec`` names the keys; ``store`` is this server's run id, '' when not identified).
local function read_pool(spec, store)
  local out = {now = now, state = redis.call('HGETALL', spec.state), members = {}}
  if store ~= '' and #out.state > 0
      and (redis.call('HGET', spec.state, 'store') or '') ~= store then
    out.stale = true
  end
  for i, m in ipairs(spec.members) do
    local entry = {
      name = m.name,
      leases = redis.call('ZCOUNT', m.leases, since, '+inf'),
      waiters = redis.call('ZCOUNT', m.waiters, since, '+inf'),
      waiting = 0,
      swap_times = redis.call('LRANGE', m.swap_times, 0, 9),
      drain_times = redis.call('LRANGE', m.drain_times, 0, 9),
      request_times = redis.call('LRANGE', m.request_times, 0, 9),
    }
    if entry.waiters > 0 then
      -- The most urgent live waiter (expired ones wait for the reaper at the front).
      local ranked = redis.call('ZRANGE', m.urgency, 0, -1, 'WITHSCORES')
      for j = 1, #ranked, 2 do
        local d = redis.call('ZSCORE', m.waiters, ranked[j])
        if d and tonumber(d) > now then
          entry.urgent = tonumber(ranked[j + 1])
          break
        end
      end
    end
    if spec.deadlines then
      -- What a supervisor sleeps on (docs/adr/0011): the earliest live lease's expiry and
      -- the earliest live waiter's deadline.
      local first = {'WITHSCORES', 'LIMIT', 0, 1}
      if entry.leases > 0 then
        entry.expiry = redis.call('ZRANGEBYSCORE', m.leases, since, '+inf', unpack(first))[2]
      end
      if entry.waiters > 0 then
        entry.deadline = redis.call('ZRANGEBYSCORE', m.waiters, since, '+inf', unpack(first))[2]
      end
    end
    if spec.attempt ~= '' then
      local s = redis.call('ZSCORE', m.waiters, spec.attempt)
      if s and tonumber(s) > now then entry.waiting = 1 end
    end
    out.members[i] = entry
  end
  if spec.attempt ~= '' then
    local lease = redis.call('HGET', spec.attempt_leases, spec.attempt)
    if lease then
      local meta = redis.call('HGET', spec.lease_meta, lease)
      if meta then
        local m = cjson.decode(meta)
        local key = spec.lease_keys[m.member]
        local s = key and redis.call('ZSCORE', key, lease)
        if s and tonumber(s) > now then
          out.lease = {id = lease, member = m.member, epoch = tostring(m.epoch), expiry = s}
        end
      end
    end
  end
  out.swap_times = redis.call('LRANGE', spec.swap_times, 0, 9)
  return cjson.encode(out)
end
"""
"""Reading a pool, defined once: the snapshot is this read alone; a commit that changes
the state returns it, made after its writes (:data:`APPLY`)."""

SNAPSHOT = (
    _NOW
    + _READ
    + """
return read_pool(cjson.decode(ARGV[1]), ARGV[2] or '')
"""
)

APPLY = (
    _NOW
    + _READ
    + """
local spec = cjson.decode(ARGV[1])
local pre = spec.pre
local state = spec.state
local store = ARGV[2] or ''
local exists = redis.call('EXISTS', state) == 1
local same_store = store == '' or (redis.call('HGET', state, 'store') or '') == store
if pre.state_unknown then
  if exists and same_store then return 0 end
elseif not exists or not same_store then
  return 0
end
if pre.version then
  if tonumber(redis.call('HGET', state, 'version') or '0') ~= pre.version then return 0 end
end
for k, v in pairs(pre.state_equals) do
  if (redis.call('HGET', state, k) or '') ~= v then return 0 end
end
for _, k in ipairs(pre.zero_leases) do
  if redis.call('ZCOUNT', k, since, '+inf') > 0 then return 0 end
end
for _, k in ipairs(pre.zero_waiters) do
  if redis.call('ZCOUNT', k, since, '+inf') > 0 then return 0 end
end
if pre.waiter_cap then
  local total = 0
  for _, k in ipairs(pre.waiter_keys) do total = total + redis.call('ZCOUNT', k, since, '+inf') end
  if total >= pre.waiter_cap then return -1 end
end
for _, op in ipairs(spec.ops) do
  if op.op == 'hset' then
    local args = {}
    for k, v in pairs(op.fields) do
      args[#args + 1] = k
      args[#args + 1] = v
    end
    if #args > 0 then redis.call('HSET', state, unpack(args)) end
    if op.bump then redis.call('HINCRBY', state, 'version', 1) end
  elseif op.op == 'lease' then
    redis.call('ZADD', op.key, op.expiry, op.id)
    redis.call('HSET', op.meta_key, op.id, op.meta)
    redis.call('HSET', op.attempt_key, op.attempt, op.id)
  elseif op.op == 'wait' then
    redis.call('ZADD', op.key, op.deadline, op.member)
    redis.call('ZADD', op.urgency_key, 'NX', op.urgency, op.member)
  elseif op.op == 'unwait' then
    redis.call('ZREM', op.key, op.member)
    redis.call('ZREM', op.urgency_key, op.member)
  elseif op.op == 'unwait_all' then
    redis.call('DEL', op.key, op.urgency_key)
  elseif op.op == 'backoff' then
    -- A failed swap's backoff: a deadline on the store's clock, judged against it.
    if op.ms > 0 then redis.call('HSET', state, op.field, now + op.ms) end
  elseif op.op == 'swap_time' then
    -- A list of recent durations (swaps, drains), newest first.
    for _, k in ipairs(op.keys) do
      redis.call('LPUSH', k, op.value)
      redis.call('LTRIM', k, 0, op.keep - 1)
    end
  elseif op.op == 'revoke' then
    for _, id in ipairs(redis.call('ZRANGE', op.key, 0, -1)) do
      local meta = redis.call('HGET', op.meta_key, id)
      if meta then
        local attempt = cjson.decode(meta).attempt
        if attempt and redis.call('HGET', op.attempt_key, attempt) == id then
          redis.call('HDEL', op.attempt_key, attempt)
        end
        redis.call('HDEL', op.meta_key, id)
      end
    end
    redis.call('DEL', op.key)
  end
end
-- A rebuilt state is this server's from now on.
if pre.state_unknown and store ~= '' then redis.call('HSET', state, 'store', store) end
-- A commit that changes the state answers with the pool as it left it, read in the same
-- script: what the state-change notification names, with no other read (ADR 0004).
if spec.read then return read_pool(spec.read, store) end
return 1
"""
)

RENEW = (
    _NOW
    + """
-- KEYS: leases of the member, state, lease-meta, attempt-leases, request times of the member
-- ARGV: lease id, ttl ms, member, lease epoch, attempt, request id, router, request time
--       ('' none), how many request times to keep, store id
-- Returns {1, shareable} renewed (or adopted), {0} gone, {-1} cannot tell (state unknown).
local st = redis.call('HMGET', KEYS[2], 'phase', 'resident', 'epoch', 'store', 'relearn',
                      'unhealthy', 'closed', 'residents', 'unwell', 'closing')
-- A capacity pool's residency set (docs/adr/0008): its members are residents too.
local in_set = string.find(',' .. (st[8] or '') .. ',', ',' .. ARGV[3] .. ',', 1, true) ~= nil
-- A resident in doubt (unhealthy) or closed to new requests (maxWait): the router keeps
-- the lease for the requests on it but shares it with no new one.
local shareable = 1
if st[2] == ARGV[3] and ((st[6] or '') ~= '' or (st[7] or '') ~= '') then shareable = 0 end
if string.find(',' .. (st[9] or '') .. ',', ',' .. ARGV[3] .. ',', 1, true) then shareable = 0 end
if string.find(',' .. (st[10] or '') .. ',', ',' .. ARGV[3] .. ',', 1, true) then shareable = 0 end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) > now then
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
  -- The longest request that ended on it lately: the member's request times (ADR 0006).
  if (ARGV[8] or '') ~= '' then
    redis.call('LPUSH', KEYS[5], ARGV[8])
    redis.call('LTRIM', KEYS[5], 0, tonumber(ARGV[9]) - 1)
  end
  return {1, shareable}
end
if not st[1] or (ARGV[10] ~= '' and (st[4] or '') ~= ARGV[10]) then return {-1} end
-- A lease the store forgot (it restarted, or failed over, and is relearning who is busy):
-- the resident's lease, issued no later than the state's epoch, is written back.
-- A cleared field reads as '' and tonumber('') is nil: both count as 0.
local serving = ((st[1] == 'idle' or st[1] == 'draining') and st[2] == ARGV[3]) or in_set
if serving and (tonumber(st[5] or '') or 0) > now
    and tonumber(ARGV[4]) <= (tonumber(st[3] or '') or 0) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  local meta = {member = ARGV[3], attempt = ARGV[5], request_id = ARGV[6], router = ARGV[7],
                epoch = tonumber(ARGV[4]), adopted = true}
  redis.call('HSET', KEYS[3], ARGV[1], cjson.encode(meta))
  if ARGV[5] ~= '' then redis.call('HSET', KEYS[4], ARGV[5], ARGV[1]) end
  return {1, shareable}
end
return {0}
"""
)

RELEASE = (
    _NOW
    + """
-- KEYS: leases, lease-meta, attempt-leases, state, request times of the member, waiters
--       of every other member...
-- ARGV: lease id, member, requests that used the lease, demand half-life ms (0: none),
--       the longest request on it in seconds ('': not kept), how many request times to keep
-- Returns {removed, live leases left on the member, phase, live waiters for the other
-- members, unhealthy} so the caller wakes the supervisor only when the release can move
-- the pool (the member's own waiters are granted when they ask again, not by a release).
-- The resident's last release is recorded (``released``: idleness is measured from it),
-- and every member's (``used.<member>``: a capacity pool's recency and idleness).
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
local meta = redis.call('HGET', KEYS[2], ARGV[1])
if meta then
  local m = cjson.decode(meta)
  if m.attempt and redis.call('HGET', KEYS[3], m.attempt) == ARGV[1] then
    redis.call('HDEL', KEYS[3], m.attempt)
  end
  redis.call('HDEL', KEYS[2], ARGV[1])
end
local left = redis.call('ZCOUNT', KEYS[1], since, '+inf')
local waiters = 0
for i = 6, #KEYS do waiters = waiters + redis.call('ZCOUNT', KEYS[i], since, '+inf') end
local st = redis.call('HMGET', KEYS[4], 'phase', 'unhealthy', 'resident', 'unwell')
if string.find(',' .. (st[4] or '') .. ',', ',' .. ARGV[2] .. ',', 1, true) then st[2] = '1' end
if removed == 1 and left == 0 and st[3] == ARGV[2] then
  redis.call('HSET', KEYS[4], 'released', now)
end
if removed == 1 and left == 0 and redis.call('EXISTS', KEYS[4]) == 1 then
  -- A capacity pool evicts the least recently used idle member first (docs/adr/0008).
  redis.call('HSET', KEYS[4], 'used.' .. ARGV[2], now)
end
-- A capacity pool's recent demand per member (``demand.<member>``, as of
-- ``demandat.<member>``): the requests that used each lease, decayed by the half-life.
local half = tonumber(ARGV[4] or '') or 0
if removed == 1 and half > 0 and redis.call('EXISTS', KEYS[4]) == 1 then
  local d = redis.call('HMGET', KEYS[4], 'demand.' .. ARGV[2], 'demandat.' .. ARGV[2])
  local at = tonumber(d[2] or '') or now
  local score = (tonumber(d[1] or '') or 0) * math.pow(0.5, (now - at) / half)
  redis.call('HSET', KEYS[4], 'demand.' .. ARGV[2], tostring(score + tonumber(ARGV[3])),
             'demandat.' .. ARGV[2], now)
end
-- The member's recent request times (docs/adr/0006): how long it takes to drain.
if removed == 1 and (ARGV[5] or '') ~= '' then
  redis.call('LPUSH', KEYS[5], ARGV[5])
  redis.call('LTRIM', KEYS[5], 0, tonumber(ARGV[6]) - 1)
end
return {removed, left, st[1] or '', waiters, st[2] or ''}
"""
)

CANCEL = """
-- An attempt gives up on a member: leave that member's waiters, and free a lease on that
-- member it was granted but never learned of (its acquire reply was lost or came after
-- the caller left). A lease the attempt holds on another member is not this cancel's.
-- KEYS: waiters of the member, attempt-leases, lease-meta, leases of the member, urgency
-- ARGV: attempt, member
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
local lease = redis.call('HGET', KEYS[2], ARGV[1])
if lease then
  local meta = redis.call('HGET', KEYS[3], lease)
  if meta and cjson.decode(meta).member == ARGV[2] then
    redis.call('ZREM', KEYS[4], lease)
    redis.call('HDEL', KEYS[3], lease)
    redis.call('HDEL', KEYS[2], ARGV[1])
    removed = removed + 1
  end
end
return removed
"""

REAP = (
    _NOW
    + """
local spec = cjson.decode(ARGV[1])
local expired = {}
for _, m in ipairs(spec.members) do
  local ids = redis.call('ZRANGEBYSCORE', m.leases, '-inf', now)
  for _, id in ipairs(ids) do
    redis.call('ZREM', m.leases, id)
    local meta = redis.call('HGET', spec.lease_meta, id)
    if meta then
      local decoded = cjson.decode(meta)
      local attempt = decoded.attempt
      if attempt and redis.call('HGET', spec.attempt_leases, attempt) == id then
        redis.call('HDEL', spec.attempt_leases, attempt)
      end
      redis.call('HDEL', spec.lease_meta, id)
    end
    expired[#expired + 1] = {id = id, member = m.name, meta = meta or ''}
  end
  for _, attempt in ipairs(redis.call('ZRANGEBYSCORE', m.waiters, '-inf', now)) do
    redis.call('ZREM', m.urgency, attempt)
  end
  redis.call('ZREMRANGEBYSCORE', m.waiters, '-inf', now)
end
if #expired == 0 then return '[]' end
return cjson.encode(expired)
"""
)

GRANT_FAST = (
    _NOW
    + """
-- The common case in one round trip: the member is resident and no swap unwinds it.
-- Exactly the grant branch of decisions.acquire; anything else answers 0 and the
-- caller takes the general path (snapshot, pure decision, compare-and-apply).
local st = redis.call('HMGET', KEYS[1], 'phase', 'resident', 'epoch', 'unhealthy', 'store',
                      'closed', 'residents', 'unwell', 'closing', 'failed.' .. ARGV[1])
-- A capacity pool (docs/adr/0008): a member of the residency set (and not unwell, nor
-- closed by maxWait) is granted in every phase (a plan loading another member takes
-- nothing from it; the members a plan evicts left the set when it started).
local in_set = (st[7] or '') ~= ''
  and string.find(',' .. st[7] .. ',', ',' .. ARGV[1] .. ',', 1, true) ~= nil
local shut = string.find(',' .. (st[8] or '') .. ',', ',' .. ARGV[1] .. ',', 1, true) ~= nil
  or string.find(',' .. (st[9] or '') .. ',', ',' .. ARGV[1] .. ',', 1, true) ~= nil
if in_set and shut then return {0} end
if not in_set then
  if (st[1] ~= 'idle' and st[1] ~= 'draining') or st[2] ~= ARGV[1] then return {0} end
  if (st[4] or '') ~= '' or (st[6] or '') ~= '' then return {0} end
elseif st[1] == 'unknown' or not st[1] then
  return {0}
end
if ARGV[7] ~= '' and (st[5] or '') ~= ARGV[7] then return {0} end
if redis.call('HGET', KEYS[4], ARGV[4]) then return {0} end
if (tonumber(st[10] or '') or 0) > now then return {0} end  -- its failure backoff runs
-- ARGV: member, lease id, ttl ms, attempt, router, client request id
local meta = cjson.encode({member = ARGV[1], attempt = ARGV[4], request_id = ARGV[6],
                           router = ARGV[5], epoch = st[3]})
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[2])
redis.call('HSET', KEYS[3], ARGV[2], meta)
redis.call('HSET', KEYS[4], ARGV[4], ARGV[2])
redis.call('ZREM', KEYS[5], ARGV[4])
redis.call('ZREM', KEYS[6], ARGV[4])
return {1, st[3]}
"""
)
