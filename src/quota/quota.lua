-- tokengate's shared quota store: one tenant's meters (budgets over windows) and the leases of
-- its reservations in flight, for every replica with the same key prefix. Run by EVALSHA from
-- src/quota/redis.rs, which works out the windows (Lua has no calendar) and decides again with
-- the Rust core of src/quota/ledger.rs on the states returned: readings, denials and their
-- retry-after are the ones a local store gives. One call is atomic: whether a reservation fits
-- every meter and taking it from all of them are one step for all replicas.
--
-- Time is the gateway's (ARGV[2]), as the windows are: a lease expires at the moment its
-- replica gave. Every call first purges the tenant's expired leases (their amounts go back to
-- the meters' reserved), so the reservations of a replica that died come back after the TTL.
--
-- KEYS[1]: the tenant's lease index, a sorted set: lease hash key -> expiry (Unix ms)
-- KEYS[2]: reserve and settle only: the reservation's lease hash (meter hash key -> amount it
--          holds there; once settled, only `settled`, for as long as a retry may come)
-- then one meter hash per meter: r = reserved; s:START and g:START = spent and granted in the
--          slice (or calendar period) that began at START (Unix ms)
-- ARGV[1] the operation, ARGV[2] now, ARGV[3] how long a key written lives (ms; only ever
-- lengthened), ARGV[4] reserve: the lease's expiry; settle: how long the settled mark lives
-- (ms); then per meter KEPT START LIMIT AMOUNT: the earliest slice start still in the window at
-- now (older slices are dropped), the start of the slice now is in, the meter's limit, and
--   reserve  the amount needed: taken from every meter, or from none   -> {fits, STATES}
--   settle   the amount used, spent in the current slice; what the lease holds goes back if it
--            is still there                   -> {1 held, 0 expired, or 2 settled already: nothing}
--   read     (unused)                                                    -> {1, STATES}
--   grant    the amount granted in the current slice                     -> {1, STATES}
--   reset    (unused): spent and granted are forgotten, reserved stays   -> {1, STATES}
-- STATES: per meter, purged and pruned but before the operation, RESERVED N then N x
-- (START SPENT GRANTED): the caller replays the operation on them with the Rust core.
--
-- Amounts are u64 (a cost in pico-units passes 2^53, where Lua numbers stop being exact), kept
-- as decimal text and computed on as pairs {high, low}, low being the last nine digits.

local E9 = 1000000000

local function num(text)
  if not text then
    return { 0, 0 }
  end
  local n = #text
  if n <= 9 then
    return { 0, tonumber(text) }
  end
  return { tonumber(string.sub(text, 1, n - 9)), tonumber(string.sub(text, n - 8)) }
end

local function plus(a, b)
  local low = a[2] + b[2]
  if low >= E9 then
    return { a[1] + b[1] + 1, low - E9 }
  end
  return { a[1] + b[1], low }
end

-- a - b, never below zero
local function minus(a, b)
  local high, low = a[1] - b[1], a[2] - b[2]
  if low < 0 then
    high, low = high - 1, low + E9
  end
  if high < 0 then
    return { 0, 0 }
  end
  return { high, low }
end

local function at_most(a, b)
  return a[1] < b[1] or (a[1] == b[1] and a[2] <= b[2])
end

local function text(a)
  if a[1] == 0 then
    return string.format('%d', a[2])
  end
  return string.format('%d%09d', a[1], a[2])
end

local U64_MAX = num('18446744073709551615')
-- Numbers go to Redis as the text they came in (a Lua number may be written otherwise).
local op, now, keep = ARGV[1], ARGV[2], ARGV[3]
local index = KEYS[1]
local first = (op == 'reserve' or op == 'settle') and 3 or 2
local meters = #KEYS - first + 1

local function arg(i, k)
  return ARGV[4 + 4 * (i - 1) + k]
end

-- Keys live at least `keep` more: until their spend has left every window, and a lease's TTL.
local function kept(key)
  if redis.call('PTTL', key) < tonumber(keep) then
    redis.call('PEXPIRE', key, keep)
  end
end

local function add(key, field, amount)
  redis.call('HSET', key, field, text(plus(num(redis.call('HGET', key, field)), amount)))
end

-- Gives back what the lease hash `lease` holds, and deletes it.
local function release(lease)
  local held = redis.call('HGETALL', lease)
  for i = 1, #held, 2 do
    local meter = held[i]
    if meter ~= 'settled' and redis.call('EXISTS', meter) == 1 then
      local left = minus(num(redis.call('HGET', meter, 'r')), num(held[i + 1]))
      redis.call('HSET', meter, 'r', text(left))
    end
  end
  redis.call('DEL', lease)
  redis.call('ZREM', index, lease)
end

-- Expired leases (a bounded number per call: the rest at the next).
for _, lease in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', now, 'LIMIT', 0, 500)) do
  release(lease)
end

-- Meter i's state, its slices that left the window dropped: reserved, then slices by start.
local function load(i)
  local key = KEYS[first + i - 1]
  local since = tonumber(arg(i, 1))
  local fields = redis.call('HGETALL', key)
  local state = { reserved = { 0, 0 }, starts = {}, slices = {} }
  for j = 1, #fields, 2 do
    local field, value = fields[j], fields[j + 1]
    if field == 'r' then
      state.reserved = num(value)
    else
      local start = string.sub(field, 3)
      if tonumber(start) < since then
        redis.call('HDEL', key, field)
      else
        if not state.slices[start] then
          state.starts[#state.starts + 1] = start
          state.slices[start] = { s = { 0, 0 }, g = { 0, 0 } }
        end
        state.slices[start][string.sub(field, 1, 1)] = num(value)
      end
    end
  end
  return state
end

local states, reply = {}, {}
for i = 1, meters do
  local state = load(i)
  states[i] = state
  reply[#reply + 1] = text(state.reserved)
  reply[#reply + 1] = tostring(#state.starts)
  for _, start in ipairs(state.starts) do
    local slice = state.slices[start]
    reply[#reply + 1] = start
    reply[#reply + 1] = text(slice.s)
    reply[#reply + 1] = text(slice.g)
  end
end

local function meter_key(i)
  return KEYS[first + i - 1]
end

-- The current slice's field of meter i for `kind` (s: spent, g: granted).
local function current(i, kind)
  return kind .. ':' .. arg(i, 2)
end

local result = '1'
if op == 'reserve' then
  -- Fits if nothing is needed, or spent + reserved + needed <= limit + granted (saturating as
  -- in the Rust core: a meter past its limit still takes a request that needs nothing of it).
  for i = 1, meters do
    local needed = num(arg(i, 4))
    if not (needed[1] == 0 and needed[2] == 0) then
      local taken, granted = states[i].reserved, { 0, 0 }
      for _, slice in pairs(states[i].slices) do
        taken, granted = plus(taken, slice.s), plus(granted, slice.g)
      end
      local limit = plus(num(arg(i, 3)), granted)
      if not at_most(limit, U64_MAX) then
        limit = U64_MAX
      end
      if not at_most(plus(taken, needed), limit) then
        result = '0'
      end
    end
  end
  if result == '1' then
    local lease = KEYS[2]
    for i = 1, meters do
      local needed = num(arg(i, 4))
      add(meter_key(i), 'r', needed)
      add(lease, meter_key(i), needed)
      kept(meter_key(i))
    end
    redis.call('ZADD', index, ARGV[4], lease)
    kept(lease)
    kept(index)
  end
elseif op == 'settle' then
  local lease = KEYS[2]
  if redis.call('HEXISTS', lease, 'settled') == 1 then
    return { '2' }
  end
  result = (redis.call('EXISTS', lease) == 1) and '1' or '0'
  release(lease)
  for i = 1, meters do
    local used = num(arg(i, 4))
    if not (used[1] == 0 and used[2] == 0) then
      add(meter_key(i), current(i, 's'), used)
      kept(meter_key(i))
    end
  end
  redis.call('HSET', lease, 'settled', '1')
  redis.call('PEXPIRE', lease, ARGV[4])
  return { result }
elseif op == 'grant' then
  for i = 1, meters do
    add(meter_key(i), current(i, 'g'), num(arg(i, 4)))
    kept(meter_key(i))
  end
elseif op == 'reset' then
  for i = 1, meters do
    for _, start in ipairs(states[i].starts) do
      redis.call('HDEL', meter_key(i), 's:' .. start, 'g:' .. start)
    end
  end
elseif op ~= 'read' then
  return redis.error_reply('unknown operation ' .. tostring(op))
end

table.insert(reply, 1, result)
return reply
