-- tokengate's shared KV ledger: every replica's leases on every backend, so that replicas in
-- front of one pool of backends admit against one ledger. Run by EVALSHA from
-- src/admission/shared.rs. One script call is atomic: whether a request fits and its
-- reservation are one step for all replicas.
--
-- Replicas are kept alive by heartbeats: every call of a replica sets its expiry (Redis TIME +
-- the lease TTL) in the registry. A replica whose expiry passed is dead: its leases are taken
-- out of the totals and deleted by the next call of any replica.
--
-- Totals are kept per backend and priority class (CLASS: 0 sheddable, 1 standard, 2 critical),
-- each class holding at most its share of a backend, as in src/admission/ledger.rs.
--
-- KEYS[1]: the registry, a sorted set: replica -> expiry (ms, Redis TIME)
-- KEYS[2]: reserved KV bytes per "CLASS NAME" (hash)
-- KEYS[3]: live sequences (batch slots) per "CLASS NAME" (hash)
-- KEYS[4]: this replica's leases (hash: lease id -> "BYTES SEQS CLASS NAME"; a value of an
--          earlier version, "BYTES CLASS NAME", runs one sequence)
-- ARGV[1] operation, ARGV[2] this replica, ARGV[3] lease TTL (ms), ARGV[4] the prefix of every
-- replica's lease hash (KEYS[4] is it followed by ARGV[2]), ARGV[5] N, then N backends as
-- NAME CAPACITY MAX_BATCH and, per class in order, its LIMIT_BYTES LIMIT_BATCH, then the
-- operation's M and its M items:
--   acquire   M x (ID BYTES SEQS CLASS):  each reserved, in order, on the backend with the most
--                                         free bytes where its bytes and its SEQS sequences
--                                         fit, its class within its share of both
--                                         (lowest index on a tie); result: its backend's index
--                                         (1-based), or 0 if it fits nowhere. The items come in
--                                         the queue's order, which is strict: after one that
--                                         fits nowhere, none is reserved (0 each)
--   release   M x ID:                     result 1 if the lease was there (its bytes go back),
--                                         else 0
--   heartbeat M x (ID BYTES SEQS CLASS NAME): the replica's live leases; any missing (its replica
--                                         was taken for dead, or Redis restarted empty) is added
--                                         again; result: 1 if added again, else 0
-- Reply: the M results, then RESERVED and LIVE of each class of each of the N backends (after
-- the call).
-- Byte counts stay far below 2^53, where Lua numbers are exact.

if redis.replicate_commands then
  redis.replicate_commands() -- Redis < 5: replicate the writes, not the script (it reads TIME)
end

local registry, reserved, live, mine = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local op, replica, ttl, lease_prefix = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local n = tonumber(ARGV[5])
local names, capacity, batch, limit_bytes, limit_batch = {}, {}, {}, {}, {}
for i = 1, n do
  local b = 5 + 9 * (i - 1)
  names[i] = ARGV[b + 1]
  capacity[i] = tonumber(ARGV[b + 2])
  batch[i] = tonumber(ARGV[b + 3])
  limit_bytes[i], limit_batch[i] = {}, {}
  for c = 0, 2 do
    limit_bytes[i][c] = tonumber(ARGV[b + 4 + 2 * c])
    limit_batch[i][c] = tonumber(ARGV[b + 5 + 2 * c])
  end
end
local at = 6 + 9 * n
local m = tonumber(ARGV[at])

-- "BYTES SEQS CLASS NAME" (or an earlier version's "BYTES CLASS NAME") -> bytes, seqs, class,
-- name. A NAME is a URL: it has no space.
local function split(v)
  local f = {}
  for w in string.gmatch(v, '[^ ]+') do f[#f + 1] = w end
  if #f == 3 then
    return tonumber(f[1]), 1, tonumber(f[2]), f[3]
  end
  return tonumber(f[1]), tonumber(f[2]), tonumber(f[3]), f[4]
end

local function take(class, name, bytes, count)
  local field = class .. ' ' .. name
  local r = redis.call('HINCRBY', reserved, field, bytes)
  local l = redis.call('HINCRBY', live, field, count)
  -- Never below zero, whatever was lost.
  if r < 0 then redis.call('HSET', reserved, field, 0) end
  if l < 0 then redis.call('HSET', live, field, 0) end
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

-- Dead replicas: their leases go back.
for _, dead in ipairs(redis.call('ZRANGEBYSCORE', registry, '-inf', '(' .. now)) do
  local key = lease_prefix .. dead
  local all = redis.call('HGETALL', key)
  for i = 2, #all, 2 do
    local bytes, seqs, class, name = split(all[i])
    take(class, name, -bytes, -seqs)
  end
  redis.call('DEL', key)
  redis.call('ZREM', registry, dead)
end
if redis.call('ZCARD', registry) == 0 then
  -- Nobody holds anything: totals start clean (nothing lost can linger).
  redis.call('DEL', reserved, live)
end
redis.call('ZADD', registry, now + ttl, replica)

-- What class c holds on backend i.
local function usage(i, c)
  local field = c .. ' ' .. names[i]
  return tonumber(redis.call('HGET', reserved, field) or '0'),
    tonumber(redis.call('HGET', live, field) or '0')
end

-- What every class holds on backend i.
local function total(i)
  local r, l = 0, 0
  for c = 0, 2 do
    local cr, cl = usage(i, c)
    r, l = r + cr, l + cl
  end
  return r, l
end

local results = {}
if op == 'acquire' then
  local blocked = false
  for j = 1, m do
    local id, bytes = ARGV[at + 4 * j - 3], tonumber(ARGV[at + 4 * j - 2])
    local seqs, class = tonumber(ARGV[at + 4 * j - 1]), tonumber(ARGV[at + 4 * j])
    local best, best_free = 0, -1
    for i = 1, blocked and 0 or n do
      local r, l = total(i)
      local cr, cl = usage(i, class)
      local free = capacity[i] - r
      if l + seqs <= batch[i] and bytes <= free and cl + seqs <= limit_batch[i][class]
        and cr + bytes <= limit_bytes[i][class] and free > best_free then
        best, best_free = i, free
      end
    end
    if best > 0 then
      redis.call('HSET', mine, id, bytes .. ' ' .. seqs .. ' ' .. class .. ' ' .. names[best])
      take(class, names[best], bytes, seqs)
    else
      blocked = true
    end
    results[j] = best
  end
elseif op == 'release' then
  for j = 1, m do
    local id = ARGV[at + j]
    local v = redis.call('HGET', mine, id)
    results[j] = 0
    if v then
      local bytes, seqs, class, name = split(v)
      redis.call('HDEL', mine, id)
      take(class, name, -bytes, -seqs)
      results[j] = 1
    end
  end
elseif op == 'heartbeat' then
  for j = 1, m do
    local id, bytes, seqs = ARGV[at + 5 * j - 4], ARGV[at + 5 * j - 3], ARGV[at + 5 * j - 2]
    local class, name = ARGV[at + 5 * j - 1], ARGV[at + 5 * j]
    results[j] = redis.call('HSETNX', mine, id, bytes .. ' ' .. seqs .. ' ' .. class .. ' ' .. name)
    if results[j] == 1 then
      take(class, name, tonumber(bytes), tonumber(seqs))
    end
  end
else
  return redis.error_reply('unknown operation ' .. tostring(op))
end

for i = 1, n do
  for c = 0, 2 do
    local r, l = usage(i, c)
    results[#results + 1] = r
    results[#results + 1] = l
  end
end
return results
