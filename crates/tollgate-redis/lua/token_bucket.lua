-- tollgate: token bucket (GCRA), one decision.
--
-- KEYS: see common.lua. KEYS[1] the state, and KEYS[2] the key's override
-- only when the limiter has per-key overrides (the client sends it when
-- the limiter's marker is set, see src/lib.rs).
-- ARGV: this script's own order, not common.lua's, so that the common
-- call sends what a hand-written GCRA script is sent, the bucket's two
-- numbers, and nothing else (each argument costs the server ~500
-- instructions; reading two numbers out of an encoding ~1,500):
--   ARGV[1]  the interval in µs (a token every that long), and
--   ARGV[2]  tau, capacity × interval in µs: the token bucket the client
--            sent (its limiter-wide override, else the configured
--            policy); '0', '0' when that policy is of another strategy
--            (then ARGV[6]): a key's override of this strategy sent the
--            client here
--   ARGV[3]  the operation (common.lua's ARGV[1]); absent: '1'
--   ARGV[4]  now (common.lua's ARGV[3])
--   ARGV[5]  the least TTL (common.lua's ARGV[4])
--   ARGV[6]  the policy sent, encoded (common.lua's ARGV[2]), only when
--            it is no token bucket
-- Trailing arguments at their defaults are not sent: in production a
-- check is one key (two on a limiter with per-key overrides) and two
-- arguments. Past the acquire path below, ARGV is rebuilt in common.lua's
-- order for everything after it.
-- State, KEYS[1], a STRING in one of two forms, written with its TTL in
-- the same SET:
--   '<tat + 999>'  digits alone: a life with no reservation. tat is the
--       theoretical arrival time, which is also the key's expiry (the
--       bucket is full again at tat); 999 more, so that the digits but the
--       last three are that expiry in ms rounded up: the SET's PXAT, cut
--       from the value, where a TTL formatted costs ~1,000 instructions
--   't:<tat>:<born>' or 't:<tat>:<born>:<refunds>'  a life with a
--       reservation: born when its first reservation was made (the life's
--       name, which a settle's mark carries; TokenBucketState::born), or 0
--       (a life the full path charged and nothing reserved yet), refunds
--       (absent when none) how far this
--       life's refunds moved tat back (µs), then the refunds a settle must
--       tell apart (common_bucket.lua's parse_refunds). A reserve appends
--       its mark: born, then the tat after the charge plus the life's
--       refunds.
-- A life begins with the first charge of a full bucket: digits alone; a
-- reserve turns it into the second form, named then, and the life keeps
-- it to its end. (A release before this one wrote the second
-- form only; it reads the first as a full bucket, so during a rolling
-- upgrade each new life a new worker begins can admit one charge more on
-- an old worker: see CHANGELOG.md.)
-- A HASH at KEYS[1] (read as nil) is another strategy's state, a
-- fresh bucket that the next charge replaces (SET), or a token bucket's
-- state as written before it was a STRING, { s = 't', x = tat, b = born }:
-- read as this state, and rewritten as a STRING by the next charge.
--
-- This file is the path of a plain acquire under the token bucket the
-- client sent (no per-key override in force) on a STRING or no state: it
-- answers alone, and first, so it builds no closure (each costs ~450
-- instructions per call). common.lua, common_bucket.lua, then
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

-- The path below is written for the fewest VM instructions on a refusal
-- (each costs the server ~35 instructions: a hot key refused is all
-- reads), so it caches the globals it reads (ARGV, KEYS) in locals.
-- common.lua's now_us, written out: as a function (a closure built on
-- every call) it costs ~1,000 instructions more per decision (callgrind,
-- scripts/script-cost.sh's hot key). Strings are made numbers by
-- arithmetic, which skips tonumber's call (~1,000 instructions each).
local A, K = ARGV, KEYS
local now
local caller = A[4]
if caller and caller ~= '' then
  now = caller + 0
else
  caller = nil
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
-- The state (a STRING, else false or nil), and the key's override when
-- sent, in one read. GET refuses a HASH: its error, a table with `err`
-- (MGET reads a HASH as false).
local state, keyed
if K[2] then
  local got = redis.call('MGET', K[1], K[2])
  state, keyed = got[1], got[2]
else
  state = redis.pcall('GET', K[1])
end

-- The stored life's debt in µs (0 when the key reads as fresh), and, in
-- the second form, i, where born begins, after the second ':' (nil for the
-- first form, or when fresh). born (and the refunds after it) stays the
-- stored digits until something computes with it: a charge in the same
-- life writes them back as they are, which costs no conversion (~1,400
-- instructions per tonumber), and a refusal never reads it. tonumber, not
-- arithmetic: anything but the first form (no key, an error, the second
-- form, a STRING that is neither form) is nil, not a failed script.
local debt, i = 0, nil
local x = tonumber(state)
if x then
  x = x - 999 - now
  if x > 0 then
    debt = x
  end
elseif state then
  if state.err then
    -- Only a HASH (WRONGTYPE) reads as nil. Any other error (a command
    -- an ACL denies) fails the call: read as a fresh key, it would admit
    -- every request.
    if string.sub(state.err, 1, 9) ~= 'WRONGTYPE' then
      error(state)
    end
    state = nil
  else
    i = string.find(state, ':', 3, true)
    x = i and tonumber(string.sub(state, 3, i - 1)) or 0
    if x > now then
      debt = x - now
    else
      i = nil
    end
  end
else
  state = nil
end

-- A plain acquire ('<n>', absent for 1) of the token bucket sent.
local t, tau = A[1] + 0, A[2] + 0
local op, n = A[3], 1
if op then
  if op ~= '1' then
    n = tonumber(op)
  end
  if t == 0 or not n or n < 0 then
    n = nil
  elseif n < 1 then
    n = 1
  end
end
if n and not keyed then
  -- n > capacity is n * t > tau: refused here too.
  local new_debt = debt + n * t
  if new_debt > tau then
    -- A life in debt (the hot key refused) answers first.
    if debt > 0 then
      return -debt - 1
    end
    if state then
      -- Stored but fresh (expired): a fresh key is deleted.
      redis.call('DEL', K[1])
      return -1
    end
  else
    -- A full bucket starts a new life, in the first form; else the life
    -- keeps its form, and in the second born and the refunds stay the
    -- stored digits.
    local v, unit, ttl
    if i then
      v = string.format('t:%d:', now + new_debt) .. string.sub(state, i + 1)
    else
      v = string.format('%d', now + new_debt + 999)
    end
    if i or caller then
      -- A caller's clock is not the server's: a TTL, not a time.
      -- common.lua's ttl_ms, written out (a closure), at least ARGV[5].
      local ms = math.floor((new_debt + 999) / 1000)
      if A[5] and ms < A[5] + 0 then
        ms = A[5] + 0
      end
      unit, ttl = 'PX', string.format('%d', ms)
    else
      -- tat in ms rounded up, on the server's clock: expired when full.
      unit, ttl = 'PXAT', string.sub(v, 1, -4)
    end
    if state then
      redis.call('SET', K[1], v, unit, ttl)
      return debt
    end
    -- No key, or a HASH: SET ... GET refuses a HASH (WRONGTYPE) and then
    -- writes nothing.
    local old = redis.pcall('SET', K[1], v, unit, ttl, 'GET')
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

-- The stored tat, as the full path reads it (0 when fresh).
local tat = 0
if debt > 0 then
  tat = now + debt
end
-- Everything else reads common.lua's order (its ARGV[1] to ARGV[4]): the
-- policy sent, when a token bucket, in the client's form (version 2 of
-- the encoding; capacity = tau / interval, exact: the client sends tau as
-- that product).
local ARGV = {
  op or '1',
  ARGV[6] or (t > 0 and string.format('2:t:%d:%d:1:%d', tau / t, t, t))
    or error('tollgate: invalid policy encoding (no policy sent)'),
  ARGV[4],
  ARGV[5],
}
local enc = keyed or ARGV[2]
