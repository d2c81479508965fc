-- tollgate: concurrency, at most max_in_flight slots held at once, each a
-- lease.
--
-- KEYS and ARGV: see common.lua; the last key is the slots:
--          <prefix>:<limiter>:{<key>}:slots   ZSET member = slot id,
--          score = lease expiry (µs)
-- Every key shares the hash tag: one cluster slot.
-- State, KEYS[1]: HASH { s = 'n', x = expiry }: x is the latest lease's
-- expiry, and the TTL of both keys. Expired slots are dropped first
-- (ZREMRANGEBYSCORE), so the work is bounded by the slots held.
-- ARGV[1]: 'h<id>' holds (or renews) slot <id>, 'x<id>' releases it; any
-- other operation looks (reset frees every slot).
-- Model: ConcurrencyState::apply.

local now = now_us()
local p = policy_in_force(1)
if p.kind ~= 'n' then
  return { -1, p.kind }
end

-- The operation of ARGV[1]: 'hold' | 'release' and the slot id (a
-- string), or common.lua's parse_op's answer.
local function parse_slot_op()
  local sigil = string.sub(ARGV[1], 1, 1)
  if sigil == 'h' then
    return 'hold', string.sub(ARGV[1], 2)
  elseif sigil == 'x' then
    return 'release', string.sub(ARGV[1], 2)
  end
  return parse_op(now)
end

local op, id = parse_slot_op()
local slots = KEYS[#KEYS]

local st = state_fields('s', 'x')
local live = st[1] == 'n' and tonumber(st[2]) > now and op ~= 'reset'
if live then
  -- Expired leases free their slots (score <= now).
  redis.call('ZREMRANGEBYSCORE', slots, '-inf', fmt(now))
elseif (st[1] or redis.pcall('EXISTS', slots)) ~= 0 then
  -- Expired, of another strategy, or reset: no slot is held. Deleted only
  -- when something is there (see sliding_window.lua: a DEL that finds
  -- nothing would let a Redis out of memory take a new key; EXISTS denied:
  -- deleted).
  redis.call('DEL', KEYS[1], slots)
end
local held = redis.call('ZCARD', slots)

local function answer(allowed)
  local remaining = 0
  if p.max > held then
    remaining = p.max - held
  end
  local retry, reset = 0, 0
  if held > 0 then
    reset = tonumber(redis.call('ZRANGE', slots, -1, -1, 'WITHSCORES')[2]) - now
    if allowed == 0 then
      -- The earliest lease, at most 1 s (concurrency::RETRY_CAP).
      retry = tonumber(redis.call('ZRANGE', slots, 0, 0, 'WITHSCORES')[2]) - now
      if retry > 1000000 then
        retry = 1000000
      end
    end
  end
  return { allowed, p.max, remaining, retry, reset, p.lease }
end

-- The key's expiry is its latest lease's; no slot left, a fresh key.
local function store()
  if held == 0 then
    redis.call('DEL', KEYS[1], slots)
    return
  end
  local x = tonumber(redis.call('ZRANGE', slots, -1, -1, 'WITHSCORES')[2])
  redis.call('HSET', KEYS[1], 's', 'n', 'x', fmt(x))
  expire(KEYS[1], x, now, slots)
end

local function free()
  if held < p.max then
    return 1
  end
  return 0
end

if op == 'hold' then
  if not redis.call('ZSCORE', slots, id) and held >= p.max then
    return answer(0)
  end
  -- Taken, or renewed when already held.
  redis.call('ZADD', slots, fmt(now + p.lease), id)
  held = redis.call('ZCARD', slots)
  store()
  return answer(1)
elseif op == 'release' then
  redis.call('ZREM', slots, id)
  held = redis.call('ZCARD', slots)
  store()
  return answer(free())
end
return answer(free())
