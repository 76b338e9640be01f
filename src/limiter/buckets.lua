-- tokengate's shared limiter store: one tenant's three token buckets (prefill, decode,
-- requests) in one hash, charged all-or-nothing, with one lease record per charge so that a
-- settle gives back at most what was charged, once. Run by EVALSHA from src/limiter/redis.rs,
-- which passes the numbers src/limiter/bucket.rs decides with (rates in units per nanosecond,
-- capacities and costs in units of 10^-12 token) and re-checks every decision against it.
--
-- KEYS[1]: the tenant's state hash {t = last update (us, Redis TIME), p, d, r = levels in units}
-- KEYS[2]: the lease of one charge ("p d r": the units it took), for charge and settle; or a
--          replica's slice record (local-first: the units its slices took and did not give
--          back), for slice and unslice
-- ARGV[1]: the operation
--   charge  R1 C1 R2 C2 R3 C3 N1 N2 N3 STATE_TTL_MS LEASE_TTL_MS          -> {fits, l1, l2, l3}
--   slice   R1 C1 R2 C2 R3 C3 N1 N2 N3 STATE_TTL_MS LEASE_TTL_MS W1 W2 W3 -> {fits, l1, l2, l3}
--   check   R1 C1 R2 C2 R3 C3 N1 N2 N3                                    -> {fits, l1, l2, l3}
--   rebase  R1 C1 R2 C2 R3 C3 STATE_TTL_MS                                 -> {}
--   settle  G1 G2 G3                                -> 1 if the lease was there
--   unslice G1 G2 G3                                -> 1 if the slice record was there
-- l1..l3 are the levels at the script's now, before the charge: the caller decides on them
-- again with the Rust core (the same denial, retry-after and snapshot as a local store).
-- A slice takes, if every level covers N (what the request needs beyond what the replica
-- holds), min(level, W) of each bucket (W >= N: the need plus the slice's top-up), and adds it
-- to the record; unslice gives back at most what the record holds and keeps the rest.
--
-- Levels exceed 2^53 (a 200,000-token bucket is 2 x 10^17 units), and Lua numbers are
-- doubles, so the arithmetic is on non-negative integers in base 10^7 limbs (least
-- significant first): every partial product and sum stays far below 2^53, hence exact.

if redis.replicate_commands then
  redis.replicate_commands() -- Redis < 5: replicate the writes, not the script (it reads TIME)
end

local BASE = 10000000

local function norm(a)
  while #a > 1 and a[#a] == 0 do
    a[#a] = nil
  end
  return a
end

local function parse(s)
  local a = {}
  local i = #s
  while i >= 1 do
    local j = math.max(1, i - 6)
    a[#a + 1] = tonumber(string.sub(s, j, i))
    i = j - 1
  end
  if #a == 0 then
    a[1] = 0
  end
  return norm(a)
end

local function show(a)
  local parts = { string.format('%d', a[#a]) }
  for i = #a - 1, 1, -1 do
    parts[#parts + 1] = string.format('%07d', a[i])
  end
  return table.concat(parts)
end

-- n: a non-negative integer below 2^53
local function from(n)
  local a = {}
  repeat
    local low = math.fmod(n, BASE)
    a[#a + 1] = low
    n = (n - low) / BASE
  until n == 0
  return a
end

local function cmp(a, b)
  if #a ~= #b then
    return #a < #b and -1 or 1
  end
  for i = #a, 1, -1 do
    if a[i] ~= b[i] then
      return a[i] < b[i] and -1 or 1
    end
  end
  return 0
end

local function add(a, b)
  local r, carry = {}, 0
  for i = 1, math.max(#a, #b) do
    local s = (a[i] or 0) + (b[i] or 0) + carry
    if s >= BASE then
      r[i], carry = s - BASE, 1
    else
      r[i], carry = s, 0
    end
  end
  if carry > 0 then
    r[#r + 1] = carry
  end
  return r
end

-- a - b, for a >= b
local function sub(a, b)
  local r, borrow = {}, 0
  for i = 1, #a do
    local s = a[i] - (b[i] or 0) - borrow
    if s < 0 then
      r[i], borrow = s + BASE, 1
    else
      r[i], borrow = s, 0
    end
  end
  return norm(r)
end

local function mul(a, b)
  local r = {}
  for i = 1, #a + #b do
    r[i] = 0
  end
  for i = 1, #a do
    local carry = 0
    for j = 1, #b do
      local s = r[i + j - 1] + a[i] * b[j] + carry
      local low = math.fmod(s, BASE)
      r[i + j - 1], carry = low, (s - low) / BASE
    end
    local k = i + #b
    while carry > 0 do
      local s = r[k] + carry
      local low = math.fmod(s, BASE)
      r[k], carry = low, (s - low) / BASE
      k = k + 1
    end
  end
  return norm(r)
end

local function min(a, b)
  if cmp(a, b) <= 0 then
    return a
  end
  return b
end

-- A lease or slice record, "P D R" in units, as three numbers.
local function record(text)
  local parts = {}
  for part in string.gmatch(text, '%d+') do
    parts[#parts + 1] = parse(part)
  end
  return parts
end

local THOUSAND = from(1000)
local op = ARGV[1]
local state = KEYS[1]

if op == 'settle' or op == 'unslice' then
  local lease = redis.call('GET', KEYS[2])
  if not lease then
    return 0 -- settled already, or expired: give nothing back
  end
  local held = record(lease)
  local backs = {}
  for i = 1, 3 do
    backs[i] = min(parse(ARGV[1 + i]), held[i])
  end
  if op == 'settle' then
    redis.call('DEL', KEYS[2])
  else
    local left, empty = {}, true
    for i = 1, 3 do
      left[i] = show(sub(held[i], backs[i]))
      if left[i] ~= '0' then
        empty = false
      end
    end
    if empty then
      redis.call('DEL', KEYS[2])
    else
      -- The rest of a slice record stays, with the time to live it had.
      local ttl = redis.call('PTTL', KEYS[2])
      redis.call('SET', KEYS[2], table.concat(left, ' '), 'PX', math.max(ttl, 1))
    end
  end
  local h = redis.call('HMGET', state, 'p', 'd', 'r')
  if not h[1] then
    return 1 -- a tenant not stored (forgotten, or idle until full) is full: nothing to add
  end
  local fields = { 'p', 'd', 'r' }
  local out = {}
  for i = 1, 3 do
    -- Raised as of the last update and capped when next read, as TenantState::refund does.
    out[#out + 1] = fields[i]
    out[#out + 1] = show(add(parse(h[i]), backs[i]))
  end
  redis.call('HSET', state, unpack(out))
  return 1
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local h = redis.call('HMGET', state, 't', 'p', 'd', 'r')
local known = h[1] ~= false
local last = now
if known then
  -- Time never moves backwards: a Redis clock stepped back (or a failover to a replica whose
  -- clock is behind) refills nothing until it passes the last update again.
  last = tonumber(h[1])
  if last > now then
    now = last
  end
end
local elapsed_ns = mul(from(now - last), THOUSAND)

local levels = {}
for i = 1, 3 do
  local rate, cap = parse(ARGV[2 * i]), parse(ARGV[2 * i + 1])
  if known then
    levels[i] = min(cap, add(parse(h[i + 1]), mul(elapsed_ns, rate)))
  else
    levels[i] = cap -- a tenant never seen (or expired) starts full
  end
end

local function store(lv, ttl_ms)
  redis.call('HSET', state, 't', string.format('%.0f', now), 'p', show(lv[1]), 'd', show(lv[2]),
    'r', show(lv[3]))
  -- Idle this long, every bucket is full again: the hash may go.
  redis.call('PEXPIRE', state, ttl_ms)
end

if op == 'rebase' then
  if known then
    store(levels, ARGV[8])
  end
  return {}
end

local fits = 1
local after = {}
for i = 1, 3 do
  local need = parse(ARGV[7 + i])
  if cmp(levels[i], need) < 0 then
    fits = 0
  else
    after[i] = sub(levels[i], need)
  end
end

if op == 'charge' and fits == 1 then
  store(after, ARGV[11])
  redis.call('SET', KEYS[2], ARGV[8] .. ' ' .. ARGV[9] .. ' ' .. ARGV[10], 'PX', ARGV[12])
end

if op == 'slice' and fits == 1 then
  local text = redis.call('GET', KEYS[2])
  local had = { { 0 }, { 0 }, { 0 } }
  if text then
    had = record(text)
  end
  local sum = {}
  for i = 1, 3 do
    local took = min(levels[i], parse(ARGV[12 + i]))
    after[i] = sub(levels[i], took)
    sum[i] = show(add(had[i], took))
  end
  store(after, ARGV[11])
  redis.call('SET', KEYS[2], table.concat(sum, ' '), 'PX', ARGV[12])
end

return { tostring(fits), show(levels[1]), show(levels[2]), show(levels[3]) }
