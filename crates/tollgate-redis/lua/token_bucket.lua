-- tollgate: token bucket (GCRA), one decision.
--
-- KEYS and ARGV: see common.lua. KEYS[1] the state, and KEYS[2] the key's
-- override only when the limiter has per-key overrides (the client sends it
-- when the limiter's marker is set, see src/lib.rs): in production the
-- common call is one key and two arguments, the operation and the policy.
-- State, KEYS[1]: STRING 't:<tat>:<born>' or 't:<tat>:<born>:<refunds>',
-- written with its TTL in the same SET (PX): tat is the theoretical arrival
-- time, which is also the key's expiry (the bucket is full again at tat),
-- born when this life of the key began (the first charge of a full
-- bucket), refunds (absent when none) how far this life's refunds moved
-- tat back (µs), then the refunds a settle must tell apart
-- (common_bucket.lua's parse_refunds). A reserve appends its mark: born,
-- then the tat after the charge plus the life's refunds.
-- A HASH at KEYS[1] (read as nil) is another strategy's state, a
-- fresh bucket that the next charge replaces (SET), or a token bucket's
-- state as written before it was a STRING, { s = 't', x = tat, b = born }:
-- read as this state, and rewritten as a STRING by the next charge.
--
-- This file is the path of a plain acquire under the token-bucket policy
-- the client sent (ARGV[2], no per-key override in force) on a STRING or
-- no state: it answers alone, and first, so it builds no closure (each
-- costs ~450 instructions per call). common.lua, common_bucket.lua, then
-- token_bucket_ops.lua come after it (src/scripts.rs) and run only for
-- everything else: other operations, a per-key override, a policy of
-- another strategy, a HASH at KEYS[1], a charge that writes nothing on a
-- key without a STRING.
--
-- Its reply is one integer, not common.lua's table (a table reply costs
-- ~5,000 instructions, formatting the six numbers in one string more): the
-- debt in µs before the decision, d >= 0 when admitted, -d - 1 when
-- refused. The client knows the policy it sent, so it derives the decision
-- from the debt with the reference model (TokenBucketState::acquire).
-- Model: TokenBucketState::acquire / peek / settle.

-- common.lua's now_us, written out: as a function (a closure built on
-- every call) it costs ~1,000 instructions more per decision (callgrind,
-- scripts/script-cost.sh's hot key). Strings are made numbers by
-- arithmetic, which skips tonumber's call (~1,000 instructions each).
local now
if ARGV[3] and ARGV[3] ~= '' then
  now = ARGV[3] + 0
else
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
-- The state (a STRING, else nil), and the key's override when sent, in
-- one read.
local state, enc, keyed
if KEYS[2] then
  local got = redis.call('MGET', KEYS[1], KEYS[2])
  state, enc, keyed = got[1], got[2] or ARGV[2], got[2]
else
  -- GET refuses a HASH (an error, read as nil like MGET does). The
  -- error is a table with `err`; a string's `err` is string.err, nil. An
  -- index, not type(): a call costs ~300 instructions more (callgrind,
  -- scripts/script-cost.sh).
  state, enc = redis.pcall('GET', KEYS[1]), ARGV[2]
  if not state or state.err then
    -- Only a HASH (WRONGTYPE) reads as nil. Any other error (a command
    -- an ACL denies) fails the call: read as a fresh key, it would admit
    -- every request.
    if state and string.sub(state.err, 1, 9) ~= 'WRONGTYPE' then
      error(state)
    end
    state = nil
  end
end

-- The stored state: tat (0 when the key reads as fresh), and i, where born
-- begins, after the second ':' (nil when fresh). born (and the refunds
-- after it) stays the stored digits until something computes with it: a charge
-- in the same life writes them back as they are, which
-- costs no conversion (~1,400 instructions per tonumber), and a refusal
-- never reads it. tonumber, not arithmetic, for the tat: a STRING that is
-- not this state reads as fresh instead of failing the script.
local tat, i = 0, nil
if state then
  i = string.find(state, ':', 3, true)
  local x = i and tonumber(string.sub(state, 3, i - 1)) or 0
  if x > now then
    tat = x
  else
    i = nil
  end
end

-- A plain acquire ('<n>') under the token-bucket policy sent, in the
-- client's form (version 2: the two numbers read here first, so the match
-- stops after them; ~950 instructions less than scanning the whole value).
-- A version-1 value (a per-key override) takes the full path below.
local capacity, t = string.match(enc, '^2:t:(%d+):(%d+):')
-- A cost of 1, the common one, without tonumber (strtod).
local n = ARGV[1] == '1' and 1 or tonumber(ARGV[1])
if capacity and not keyed and n and n >= 0 then
  if n < 1 then
    n = 1
  end
  capacity, t = capacity + 0, t + 0
  local debt = 0
  if tat > now then
    debt = tat - now
  end
  local new_debt = debt + n * t
  if n > capacity or new_debt > capacity * t then
    if state then
      if tat == 0 then
        -- Stored but fresh (expired): a fresh key is deleted.
        redis.call('DEL', KEYS[1])
      end
      return -debt - 1
    end
  else
    -- A full bucket starts a new life, born now, nothing refunded; else
    -- born and the refunds stay the stored digits.
    local x, v = now + new_debt
    if debt > 0 then
      v = string.format('t:%d:', x) .. string.sub(state, i + 1)
    else
      v = string.format('t:%d:%d', x, now)
    end
    -- int.lua's ttl_ms, written out (a closure). A number argument is
    -- sent as '%.14g' digits: a TTL stays below 2^53 µs, 9.1e12 ms.
    local ms = math.floor((new_debt + 999) / 1000)
    if ARGV[4] and ms < ARGV[4] + 0 then
      ms = ARGV[4] + 0
    end
    if state then
      redis.call('SET', KEYS[1], v, 'PX', ms)
      return debt
    end
    -- No key, or a HASH: SET ... GET refuses a HASH (WRONGTYPE) and then
    -- writes nothing.
    local old = redis.pcall('SET', KEYS[1], v, 'PX', ms, 'GET')
    -- old is false (no key) or GET's error (a HASH), never a string.
    if not (old and old.err) then
      return debt
    end
    if string.sub(old.err, 1, 9) ~= 'WRONGTYPE' then
      error(old)
    end
  end
  -- A HASH, or a refusal on a key read as nil: the full path below reads
  -- whatever is there.
end
