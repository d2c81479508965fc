-- tollgate: concurrency, at most max_in_flight slots held at once, each a
-- lease.
--
-- KEYS and ARGV: see common.lua; the last key is the slots:
--          <prefix>:<limiter>:{<key>}:slots   ZSET
--          a slot held: member = slot id, score = lease expiry (µs, > 0);
--          an id withdrawn (remembered so that its hold, landing late or
--          sent again, takes nothing: see the model's module docs):
--          member = 'r' and the id in 20 digits (ties go by the number, as
--          the model's), score = minus when it is forgotten (µs, < 0); at
--          most WITHDRAWN_MAX. In the key the slots live in, not a key of
--          its own: a call naming a key that exists and one that does not
--          is refused (-TRYAGAIN) while a cluster migrates its slot.
-- Every key shares the hash tag: one cluster slot.
-- State, KEYS[1]: HASH { s = 'n', x = expiry, r = forgotten, c = count }:
-- x is the latest lease's or remembered id's expiry, and the TTL of both
-- keys; r when the latest remembered id is forgotten, c how many are
-- (both absent: none), so that the common call, with none, counts and
-- looks as it did before ids were remembered. A call that writes drops
-- expired slots and forgotten ids first (ZREMRANGEBYSCORE), so what the key
-- holds is bounded: max_in_flight slots, WITHDRAWN_MAX ids. A call that
-- records nothing (a look, a refused hold) is answered before it writes,
-- so that it is answered while the server refuses writes, and drops them
-- after, where the server takes writes.
-- ARGV[1]: 'h<id>' holds (or renews) slot <id>, 'x<id>' releases it,
-- 'w<id>' withdraws it (releases it, and remembers <id>); any other
-- operation looks (reset frees every slot).
-- Model: ConcurrencyState::apply.

local now = now_us()
local p = policy_in_force(1)
if p.kind ~= 'n' then
  return { -1, p.kind }
end

-- The operation of ARGV[1]: 'hold' | 'release' | 'withdraw' and the slot
-- id (a string), or common.lua's parse_op's answer.
local function parse_slot_op()
  local sigil = string.sub(ARGV[1], 1, 1)
  if sigil == 'h' then
    return 'hold', string.sub(ARGV[1], 2)
  elseif sigil == 'x' then
    return 'release', string.sub(ARGV[1], 2)
  elseif sigil == 'w' then
    return 'withdraw', string.sub(ARGV[1], 2)
  end
  return parse_op(now)
end

-- The model's WITHDRAWN_MAX.
local WITHDRAWN_MAX = 1024

local op, id = parse_slot_op()
local slots = KEYS[#KEYS]

local st = state_fields('s', 'x', 'r', 'c')
local live = st[1] == 'n' and tonumber(st[2]) > now and op ~= 'reset'
-- The ids remembered: when the latest is forgotten, and how many (0: none).
local forgotten, remembered = 0, 0
-- The slots held (leases after now).
local held = 0

-- A remembered id's member.
local function member(slot)
  return 'r' .. string.rep('0', 20 - #slot) .. slot
end

-- At most 1 s (concurrency::RETRY_CAP).
local function capped(retry)
  if retry > 1000000 then
    return 1000000
  end
  return retry
end

-- retry: a refusal's retry-after, or nil for the earliest lease's.
local function answer(allowed, retry)
  local remaining = 0
  if p.max > held then
    remaining = p.max - held
  end
  local reset = 0
  if held > 0 then
    reset = tonumber(redis.call('ZRANGE', slots, -1, -1, 'WITHSCORES')[2]) - now
    if allowed == 0 and not retry then
      -- The earliest lease: the least score after now (remembered ids
      -- score below 0, expired slots not yet swept below now).
      local first = redis.call('ZRANGE', slots, '(' .. fmt(now), '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
      retry = capped(tonumber(first[2]) - now)
    end
  end
  return { allowed, p.max, remaining, retry or 0, reset, p.lease }
end

local function free()
  if held < p.max then
    return 1
  end
  return 0
end

-- Drops what has expired, as the model's every decision does before it
-- decides: expired leases and forgotten ids, or the whole key when it has
-- expired (or is of another strategy, or reset); counts the ids still
-- remembered.
local function sweep()
  if live then
    -- Expired leases free their slots (0 < score <= now).
    redis.call('ZREMRANGEBYSCORE', slots, '0', fmt(now))
    forgotten = tonumber(st[3]) or 0
    local left = forgotten > now
    if left then
      -- Forgotten ids: -score <= now.
      local gone = redis.call('ZREMRANGEBYSCORE', slots, fmt(-now), '(0')
      remembered = (tonumber(st[4]) or 0) - gone
      -- None left all the same: the script of the release before remembered
      -- ids (a worker of a rolling upgrade) drops them all with the expired
      -- slots (their scores are below now), and leaves r and c.
      local least = redis.call('ZRANGE', slots, 0, 0, 'WITHSCORES')[2]
      left = least ~= nil and tonumber(least) < 0
      if left and gone > 0 then
        -- Counted as the set holds them.
        redis.call('HSET', KEYS[1], 'c', fmt(remembered))
      end
    end
    if forgotten > 0 and not left then
      -- Every remembered id forgotten: counted as none (left in the HASH, r
      -- would count them again after a clock stepped back before it).
      redis.call('ZREMRANGEBYSCORE', slots, '-inf', '(0')
      redis.call('HDEL', KEYS[1], 'r', 'c')
      forgotten, remembered, st[3] = 0, 0, nil
    end
  elseif (st[1] or redis.pcall('EXISTS', slots)) ~= 0 then
    -- Expired, of another strategy, or reset: no slot is held. Deleted only
    -- when something is there (see sliding_window.lua: a DEL that finds
    -- nothing would let a Redis out of memory take a new key; EXISTS denied:
    -- deleted).
    redis.call('DEL', KEYS[1], slots)
  end
end

-- What records nothing is answered before anything is written: a look,
-- and a hold refused (its id withdrawn, or every slot held by another).
-- Those are then answered exactly while the server refuses writes (a
-- failed save, too few replicas), as the other strategies' refusals are,
-- and a fail-open limiter lets through only what it cannot count. Then
-- what has expired is dropped, as by the model, where the server takes
-- writes (refused, nothing is written: Redis refuses a script's first
-- write, and lets one that has written finish); left, a clock stepped
-- back before the instants this call found past would find expired
-- leases held again, and forgotten ids remembered, where the model has
-- forgotten them.
local function answered(reply)
  pcall(sweep)
  return reply
end

-- Whether every slot is held, by score: the p.max-th greatest score is a
-- lease after now (remembered ids score below 0, expired slots below now).
-- By rank, O(log N), with the commands the documented ACL grants (no
-- ZCOUNT).
local function all_held()
  local nth = redis.call('ZRANGE', slots, -p.max, -p.max, 'WITHSCORES')[2]
  return nth ~= nil and tonumber(nth) > now
end
-- The slots held, by score, up to p.max: all an answer reads of the count.
-- Fewer than p.max: the set less the rank of the first lease after now,
-- found by halving the ranks (O(log^2 N); not the leases read one by one,
-- up to max_in_flight of them into Lua at every look).
local function held_by_score()
  if all_held() then
    return p.max
  end
  local card = redis.call('ZCARD', slots)
  -- The first lease after now lies in [lo, hi] (hi = card: none): the
  -- p.max-th greatest score is not after now.
  local lo, hi = math.max(card - p.max, 0), card
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if tonumber(redis.call('ZRANGE', slots, mid, mid, 'WITHSCORES')[2]) > now then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return card - lo
end
local looks = op ~= 'hold' and op ~= 'release' and op ~= 'withdraw' and op ~= 'reset'
if live and op == 'hold' then
  if (tonumber(st[3]) or 0) > now then
    local score = redis.call('ZSCORE', slots, member(id))
    if score and -tonumber(score) > now then
      -- Withdrawn before this hold landed: its caller is gone.
      held = held_by_score()
      return answered(answer(0, capped(-tonumber(score) - now)))
    end
  end
  if all_held() then
    local mine = redis.call('ZSCORE', slots, id)
    if not mine or tonumber(mine) <= now then
      held = p.max
      return answered(answer(0))
    end
  end
end
if looks then
  -- As the set stands (a key expired, or of another strategy, holds
  -- nothing).
  if live then
    held = held_by_score()
  end
  return answered(answer(free()))
end

sweep()
held = redis.call('ZCARD', slots) - remembered

-- The key's expiry is its latest lease's or remembered id's; neither left,
-- a fresh key.
local function store()
  local x = forgotten
  if held > 0 then
    local last = tonumber(redis.call('ZRANGE', slots, -1, -1, 'WITHSCORES')[2])
    if last > x then
      x = last
    end
  end
  if x == 0 then
    redis.call('DEL', KEYS[1], slots)
    return
  end
  if remembered > 0 then
    redis.call('HSET', KEYS[1], 's', 'n', 'x', fmt(x), 'r', fmt(forgotten), 'c', fmt(remembered))
  else
    redis.call('HSET', KEYS[1], 's', 'n', 'x', fmt(x))
    if st[3] then
      -- Every remembered id forgotten since.
      redis.call('HDEL', KEYS[1], 'r', 'c')
    end
  end
  expire(KEYS[1], x, now, slots)
end

if op == 'hold' then
  -- Not refused above: taken, or renewed when already held.
  held = held + redis.call('ZADD', slots, fmt(now + p.lease), id)
  store()
  return answer(1)
elseif op == 'release' or op == 'withdraw' then
  if redis.call('ZREM', slots, id) == 1 then
    held = held - 1
  end
  if op == 'withdraw' then
    -- Remembered for one lease (the model's remember_withdrawn).
    remembered = remembered + redis.call('ZADD', slots, fmt(-now - p.lease), member(id))
    if remembered > WITHDRAWN_MAX then
      -- The earliest forgotten goes: the greatest score below 0, and the
      -- smallest id among those of that score.
      local top = redis.call('ZRANGE', slots, '(0', '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1, 'WITHSCORES')
      local first = redis.call('ZRANGE', slots, top[2], top[2], 'BYSCORE', 'LIMIT', 0, 1)
      redis.call('ZREM', slots, first[1])
      remembered = remembered - 1
    end
    -- The latest forgotten: the least score.
    forgotten = -tonumber(redis.call('ZRANGE', slots, 0, 0, 'WITHSCORES')[2])
  end
  store()
  return answer(free())
end
return answer(free())
