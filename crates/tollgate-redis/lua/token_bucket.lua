-- tollgate: token bucket (GCRA), one decision.
--
-- KEYS and ARGV: see common.lua. Two keys: KEYS[1] the state, KEYS[2] the
-- key's override; in production an acquire sends two arguments, the
-- operation and the policy.
-- State, KEYS[1]: STRING 't:<tat>:<born>', written with its TTL in the same
-- SET (PX): tat is the theoretical arrival time, which is also the key's
-- expiry (the bucket is full again at tat), born when this life of the key
-- began (the first charge of a full bucket). A reserve appends its mark:
-- born, the tat after the charge.
-- Another strategy's HASH at KEYS[1] (not a STRING: MGET reads nil) is a
-- fresh bucket, which the next write (SET) replaces; a HASH
-- { s = 't', x = tat, b = born } is this state as written before it was a
-- STRING: read as such, and rewritten as a STRING by the next charge.
--
-- This file is the decision (gcra) and the path of a plain acquire under a
-- token-bucket policy, which answers alone: int.lua comes before it, and
-- common.lua then token_bucket_ops.lua after it (src/scripts.rs), where
-- every other operation or a policy of another strategy goes on; their
-- helpers are only built (closures) on that path.
-- Model: TokenBucketState::acquire / peek / settle.

local now
if ARGV[3] and ARGV[3] ~= '' then
  now = tonumber(ARGV[3])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- The state and the key's override in one read.
local got = redis.call('MGET', KEYS[1], KEYS[2])
local enc = got[2] or ARGV[2]

-- The stored state (tat, born), 0, 0 when the key reads as fresh; present
-- when something is stored at KEYS[1] (fresh or not).
local tat, born, present = 0, 0, false
if got[1] then
  present = true
  local x, b = string.match(got[1], '^t:(%d+):(%d+)$')
  if x and tonumber(x) > now then
    tat, born = tonumber(x), tonumber(b)
  end
else
  -- No key, or a HASH: another strategy's, or this one's before it was a
  -- STRING (see above).
  local h = redis.pcall('HMGET', KEYS[1], 's', 'x', 'b')
  if h.err or h[1] then
    present = true
    if h[1] == 't' and tonumber(h[2]) > now then
      tat, born = tonumber(h[2]), tonumber(h[3] or '0')
    end
  end
end

-- Writes the state, with its TTL.
local function store(x, b)
  redis.call('SET', KEYS[1], 't:' .. fmt(x) .. ':' .. fmt(b), 'PX', ttl_ms(x, now))
end

-- The decision (TokenBucketState::acquire, or peek unless `charge`) of
-- `cost` units (at least 1) on a bucket of `capacity` units refilling one
-- every t µs, from the stored (tat, born). `reserve` appends the mark to an
-- admitted charge. A state that is `stale` (present but fresh) is deleted
-- unless a charge replaces it.
local function gcra(capacity, t, tat, born, cost, charge, reserve, stale)
  local tau = capacity * t
  if tat <= now then
    -- A full bucket: a charge starts a new life.
    born = now
    tat = now
  end
  local debt = tat - now
  local remaining = 0
  if tau > debt then
    remaining = idiv(tau - debt, t)
  end
  local reply
  -- cost <= capacity below: new_debt stays within what tau holds.
  local new_debt = debt + cost * t
  if cost > capacity then
    reply = { 2, capacity, remaining, 0, debt, tau }
  elseif new_debt > tau then
    reply = { 0, capacity, remaining, new_debt - tau, debt, tau }
  elseif not charge then
    reply = { 1, capacity, remaining, 0, debt, tau }
  else
    local new_tat = now + new_debt
    store(new_tat, born)
    reply = { 1, capacity, idiv(tau - new_debt, t), 0, new_debt, tau }
    if reserve then
      reply[7], reply[8] = born, new_tat
    end
    return reply
  end
  if stale then
    redis.call('DEL', KEYS[1])
  end
  return reply
end

-- A plain acquire ('<n>') under a token-bucket policy: decided here.
local capacity, interval = string.match(enc, '^1:t:(%d+):%d+:%d+:(%d+)$')
local n = tonumber(ARGV[1])
if capacity and n and n >= 0 then
  if n < 1 then
    n = 1
  end
  return gcra(tonumber(capacity), tonumber(interval), tat, born, n, true, false, present and tat == 0)
end
