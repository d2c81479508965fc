-- tollgate: token bucket (GCRA), one decision.
--
-- KEYS and ARGV: see common.lua. KEYS[1] the state, and KEYS[2] the key's
-- override only when the limiter has per-key overrides (the client sends it
-- when the limiter's marker is set, see src/lib.rs): in production the
-- common call is one key and two arguments, the operation and the policy.
-- State, KEYS[1]: STRING 't:<tat>:<born>', written with its TTL in the same
-- SET (PX): tat is the theoretical arrival time, which is also the key's
-- expiry (the bucket is full again at tat), born when this life of the key
-- began (the first charge of a full bucket). A reserve appends its mark:
-- born, the tat after the charge.
-- A HASH at KEYS[1] (read as nil) is another strategy's state, a
-- fresh bucket that the next charge replaces (SET), or a token bucket's
-- state as written before it was a STRING, { s = 't', x = tat, b = born }:
-- read as this state, and rewritten as a STRING by the next charge.
--
-- This file holds the decision (decide) and the path of a plain acquire
-- under a token-bucket policy on a STRING or no state, which answers
-- alone. int.lua comes before it; common.lua, then token_bucket_ops.lua
-- come after it (src/scripts.rs) and run only for everything else: other
-- operations, a policy of another strategy, a HASH at KEYS[1], a charge
-- that writes nothing on a key without a STRING. Their helpers are built
-- (closures) only then.
-- Model: TokenBucketState::acquire / peek / settle.

-- common.lua's now_us, written out: as a function in int.lua (a closure
-- built on every call) it costs ~1,000 instructions more per decision
-- (callgrind, scripts/script-cost.sh's hot key).
local now
if ARGV[3] and ARGV[3] ~= '' then
  now = tonumber(ARGV[3])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- The state (a STRING, else nil), and the key's override when sent, in
-- one read.
local state, enc
if KEYS[2] then
  local got = redis.call('MGET', KEYS[1], KEYS[2])
  state, enc = got[1], got[2] or ARGV[2]
else
  -- GET refuses a HASH (an error, read as nil like MGET does).
  state, enc = redis.pcall('GET', KEYS[1]), ARGV[2]
  if type(state) ~= 'string' then
    state = nil
  end
end

-- The stored state: tat, born (0, 0 when the key reads as fresh). born
-- stays the stored digits until something computes with it (written back
-- as they are, it costs no conversion: ~1.4k instructions per tonumber).
local tat, born = 0, 0
if state then
  local i = string.find(state, ':', 3, true)
  local x = i and tonumber(string.sub(state, 3, i - 1)) or 0
  if x > now then
    tat, born = x, string.sub(state, i + 1)
  end
end

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

-- A plain acquire ('<n>') under a token-bucket policy.
local capacity, interval = string.match(enc, '^1:t:(%d+):%d+:%d+:(%d+)$')
-- A cost of 1, the common one, without tonumber (strtod: ~1.4k instructions).
local n = ARGV[1] == '1' and 1 or tonumber(ARGV[1])
if capacity and n and n >= 0 then
  if n < 1 then
    n = 1
  end
  local reply, x, b = decide(tonumber(capacity), tonumber(interval), tat, born, n, true, false)
  if x then
    -- b: the stored digits, or now (a number) for a new life.
    local v, ms
    if type(b) == 'string' then
      v = string.format('t:%d:', x) .. b
    else
      v = string.format('t:%d:%d', x, b)
    end
    ms = ttl_ms(x, now)
    if state then
      redis.call('SET', KEYS[1], v, 'PX', ms)
      return reply
    end
    -- No key, or a HASH: SET ... GET refuses a HASH (WRONGTYPE) and then
    -- writes nothing.
    local old = redis.pcall('SET', KEYS[1], v, 'PX', ms, 'GET')
    if not (type(old) == 'table' and old.err) then
      return reply
    end
  elseif state then
    if tat == 0 then
      -- Stored but fresh (expired): a fresh key is deleted.
      redis.call('DEL', KEYS[1])
    end
    return reply
  end
  -- A HASH, or nothing written on a key read as nil: the full path
  -- below reads whatever is there.
end
