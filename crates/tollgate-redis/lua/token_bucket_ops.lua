-- tollgate: token bucket, everything but token_bucket.lua's acquire path:
-- peek, penalise (records nothing: a peek of 1), reset, reserve, settle, a
-- policy in force of another strategy, a HASH at KEYS[1] (see
-- token_bucket.lua). Runs after token_bucket.lua, common.lua and
-- common_bucket.lua (src/scripts.rs), with their locals: now, state, enc,
-- keyed, tat, i, and ARGV in common.lua's order.

-- The decision (TokenBucketState::acquire, or peek unless `charge`) of
-- `cost` units (at least 1) on a bucket of `capacity` units refilling one
-- every t µs, from the stored tat, born and refunds (common_bucket.lua's
-- parse_refunds). Returns the reply, and for an admitted charge the state
-- to write: tat, born, refunds (`reserve` appends the mark to the reply:
-- born, tat + the life's refunds, the interval charged).
local function decide(capacity, t, tat, born, refunds, cost, charge, reserve)
  local tau = capacity * t
  if tat <= now then
    -- A full bucket: a charge starts a new life, unnamed until its first
    -- reservation (TokenBucketState::born).
    born, refunds = 0, { n = 0 }
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
    -- The life's first reservation names it, at least 1: 0 is unnamed
    -- (TokenBucketState::reserved).
    if born == 0 then
      born = now > 0 and now or 1
    end
    reply[7], reply[8], reply[9] = born, new_tat + refunds.n, t
  end
  return reply, new_tat, born, refunds
end

-- born as a number, and the refunds after it (absent when none; the
-- acquire path left where born's digits begin, in the second form). A life
-- in the first form has no reservation: unnamed, 0 (see token_bucket.lua).
local born, refunds = 0, { n = 0 }
if i then
  local b, r = string.match(state, '^(%d+):?(.*)$', i + 1)
  born, refunds = tonumber(b) or 0, parse_refunds(r)
end
-- A key's override (keyed) is checked as stored; ARGV[2] is the client's.
-- A key's override across the concurrency boundary from ARGV[2] is no
-- policy (common.lua's policy_in_force).
local p = decode(enc, keyed)
if keyed and (p.kind == 'n') ~= (string.sub(ARGV[2], 1, 4) == '1:n:') then
  error('tollgate: invalid policy encoding (an override across the concurrency boundary)')
end
if p.kind ~= 't' then
  return { -1, p.kind }
end
local op, cost, settle = parse_op(now)

-- Whether something is stored at KEYS[1]; a HASH was read as nil.
local present = state and true or false
if not present then
  local h = redis.pcall('HMGET', KEYS[1], 's', 'x', 'b')
  -- Any error but WRONGTYPE fails the call (see common.lua's state_fields).
  if h.err and string.sub(h.err, 1, 9) ~= 'WRONGTYPE' then
    error(h)
  end
  if h.err or h[1] then
    present = true
    if h[1] == 't' and tonumber(h[2]) > now then
      -- This state as written before it was a STRING.
      tat, born = tonumber(h[2]), tonumber(h[3] or '0')
    end
  end
end
if op == 'reset' then
  tat, born, refunds = 0, 0, { n = 0 }
end
if present and tat == 0 then
  -- Expired, of another strategy, or reset: the key is fresh.
  redis.call('DEL', KEYS[1])
  present = false
end

-- Writes the state with its TTL (SET replaces a HASH).
local function store(x, b, r)
  local v = string.format('t:%d:%d', x, b)
  local rv = fmt_refunds(r)
  if rv then
    v = v .. ':' .. rv
  end
  redis.call('SET', KEYS[1], v, 'PX', ttl_ms(x, now))
end

if op == 'reset' or op == 'penalise' then
  op, cost = 'peek', 1
end
if op == 'settle' then
  tat, born, refunds =
    bucket_settle(p, tat, born, refunds, now, cost, settle.actual, settle.marks[1])
  if tat > now then
    store(tat, born, refunds)
  elseif present then
    redis.call('DEL', KEYS[1])
  end
  op, cost = 'peek', 1
end
local reply, x, b, r =
  decide(p.capacity, p.interval, tat, born, refunds, cost, op == 'acquire', RESERVE)
if x then
  store(x, b, r)
end
return reply
