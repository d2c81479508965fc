-- tollgate: token bucket, everything but token_bucket.lua's acquire path:
-- peek, penalise (records nothing: a peek of 1), reset, reserve, settle, a
-- policy in force of another strategy, a HASH at KEYS[1] (see
-- token_bucket.lua). Runs after token_bucket.lua and common.lua
-- (src/scripts.rs), with their locals: now, state, enc, tat, i.

-- The decision (TokenBucketState::acquire, or peek unless `charge`) of
-- `cost` units (at least 1) on a bucket of `capacity` units refilling one
-- every t µs, from the stored tat and born. Returns the reply, and for an
-- admitted charge the state to write: tat, born (`reserve` appends them to
-- the reply, its mark).
local function decide(capacity, t, tat, born, cost, charge, reserve)
  local tau = capacity * t
  if tat <= now then
    -- A full bucket: a charge starts a new life.
    born = now
    tat = now
  end
  local debt = tat - now
  -- Only used once cost <= capacity: it stays within what tau holds.
  local new_debt = debt + cost * t
  if cost > capacity or new_debt > tau or not charge then
    local remaining = 0
    if tau > debt then
      remaining = idiv(tau - debt, t)
    end
    if cost > capacity then
      return { 2, capacity, remaining, 0, debt, tau }
    elseif new_debt > tau then
      return { 0, capacity, remaining, new_debt - tau, debt, tau }
    end
    return { 1, capacity, remaining, 0, debt, tau }
  end
  local new_tat = now + new_debt
  local reply = { 1, capacity, idiv(tau - new_debt, t), 0, new_debt, tau }
  if reserve then
    reply[7], reply[8] = born, new_tat
  end
  return reply, new_tat, born
end

-- born as a number (the acquire path left where its digits begin).
local born = i and tonumber(string.sub(state, i + 1)) or 0
local p = decode(enc)
if p.kind ~= 't' then
  return { -1, p.kind }
end
local op, cost, settle = parse_op()

-- Whether something is stored at KEYS[1]; a HASH was read as nil.
local present = state and true or false
if not present then
  local h = redis.pcall('HMGET', KEYS[1], 's', 'x', 'b')
  if h.err or h[1] then
    present = true
    if h[1] == 't' and tonumber(h[2]) > now then
      -- This state as written before it was a STRING.
      tat, born = tonumber(h[2]), tonumber(h[3] or '0')
    end
  end
end
if op == 'reset' then
  tat, born = 0, 0
end
if present and tat == 0 then
  -- Expired, of another strategy, or reset: the key is fresh.
  redis.call('DEL', KEYS[1])
  present = false
end

-- Writes the state with its TTL (SET replaces a HASH).
local function store(x, b)
  redis.call('SET', KEYS[1], string.format('t:%d:%d', x, b), 'PX', ttl_ms(x, now))
end

if op == 'reset' or op == 'penalise' then
  op, cost = 'peek', 1
end
if op == 'settle' then
  tat, born = bucket_settle(p, tat, born, now, cost, settle.actual, settle.marks[1])
  if tat > now then
    store(tat, born)
  elseif present then
    redis.call('DEL', KEYS[1])
  end
  op, cost = 'peek', 1
end
local reply, x, b = decide(p.capacity, p.interval, tat, born, cost, op == 'acquire', RESERVE)
if x then
  store(x, b)
end
return reply
