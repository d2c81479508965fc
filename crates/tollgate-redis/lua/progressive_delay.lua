-- tollgate: progressive delay, one decision.
--
-- KEYS and ARGV: see common.lua (two keys: state, key override). An
-- acquire records its number of failures; a peek (whatever its number), a
-- penalty and a reset record none and report whether the key is blocked.
-- A cost never is impossible here.
-- A reserve ('r<n>') is a login attempt taken up front: a key blocked now
-- refuses it and records nothing (as a peek); a free key records its n
-- failures (the one that passes the free attempts starts the delay) and
-- allows it, appending its mark: born (when this life of the key began,
-- its first failure since fresh), at (the failure's instant), 0. A settle
-- ('s<units>:<actual>:<born>,<at>') refunds units - actual failures if the
-- mark's born is this life's (never below zero; the block and the last
-- failure stay), or records actual - units more failures; answers '?1'.
-- State, KEYS[1]: HASH { s = 'p', x = expiry, f = failures,
-- b = blocked until, l = last failure, o = born (absent in a state written
-- before reservations: 0, its life goes on as one) }. A state whose
-- failures were all refunded (f = 0) lives until its block ends.
-- Model: ProgressiveDelayState::acquire / peek / reserve / settle.

local now = now_us()
local p = policy_in_force(0)
if p.kind ~= 'p' then
  return { -1, p.kind }
end
local op, cost, settle = parse_op(now)

-- The failure count saturates at 2^53 (as the model's does, MAX_FAILURES):
-- a cost is never impossible here, so a client whose requests carry it
-- adds up to 2^53 failures a call (the client's cap on a cost), and a
-- count past 2^63 was written by string.format('%d') as a negative
-- number, which no delay follows. Past any free_attempts (the encoding
-- keeps them below 2^53), the saturated count blocks as the model's does;
-- a negative count stored before can only be such a wrapped one.
local MAX_FAILURES = 2 ^ 53

local st = state_fields('s', 'x', 'f', 'b', 'l', 'o')
local f, b, l, o = 0, 0, 0, 0
local existed = st[1]
if st[1] == 'p' and tonumber(st[2]) > now and op ~= 'reset' then
  f, b, l = tonumber(st[3]), tonumber(st[4]), tonumber(st[5])
  o = tonumber(st[6]) or 0
  if f < 0 then
    f = MAX_FAILURES
  end
elseif st[1] then
  -- Expired, of another strategy (a token bucket's STRING), or reset: the
  -- key is fresh.
  redis.call('DEL', KEYS[1])
  existed = false
end

local function expires_at()
  if f == 0 then
    return b
  end
  local e = l + p.forget
  if b > e then
    e = b
  end
  return e
end

-- The delay of the n-th failure: ProgressiveDelay::delay_micros.
local function delay_of(n)
  if n <= p.free then
    return 0
  end
  local d = p.base
  if p.factor > 1 then
    local k = n - p.free - 1
    while k > 0 and d < p.max do
      d = d * p.factor
      k = k - 1
    end
  end
  if d > p.max then
    d = p.max
  end
  return d
end

if f > 0 and expires_at() <= now then
  f, b, l, o = 0, 0, 0, 0
end

local function record(n)
  if f == 0 then
    -- A new life: its first failure.
    o = now
  end
  f = f + n
  if f > MAX_FAILURES then
    f = MAX_FAILURES
  end
  l = now
  local delay = delay_of(f)
  if delay > 0 and now + delay > b then
    b = now + delay
  end
end

-- Whether the state was written (its expiry follows it), and whether this
-- is a reservation that passed.
local wrote, reserved = false, false
if op == 'acquire' then
  if not (RESERVE and now < b) then
    record(cost)
    wrote = true
    reserved = RESERVE
  end
elseif op == 'settle' then
  wrote = true
  if settle.actual > cost then
    record(settle.actual - cost)
  else
    local m = settle.marks[1]
    if m and m.born == o and f > 0 then
      local back = cost - settle.actual
      if back > f then
        back = f
      end
      f = f - back
    end
  end
end

local allowed = 0
if now >= b or reserved then
  allowed = 1
end
local retry = 0
if b > now and not reserved then
  retry = b - now
end
local e = expires_at()
local reset = 0
if e > now then
  reset = e - now
end
local remaining = 0
if p.free > f then
  remaining = p.free - f
end

if wrote and e > now then
  redis.call('HSET', KEYS[1], 's', 'p', 'x', fmt(e), 'f', fmt(f), 'b', fmt(b), 'l', fmt(l), 'o', fmt(o))
  expire(KEYS[1], e, now)
elseif existed and e <= now then
  -- Reset, forgotten, refunded with no block left, or another strategy's
  -- state: the key is fresh.
  redis.call('DEL', KEYS[1])
end
if reserved then
  return { allowed, p.free, remaining, retry, reset, p.forget, o, l, 0 }
end
return { allowed, p.free, remaining, retry, reset, p.forget }
