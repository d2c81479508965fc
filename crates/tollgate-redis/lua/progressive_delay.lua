-- tollgate: progressive delay, one decision.
--
-- KEYS and ARGV: see common.lua (two keys: state, key override). An
-- acquire records its number of failures; a peek (whatever its number), a
-- penalty and a reset record none and report whether the key is blocked.
-- A cost never is impossible here.
-- State, KEYS[1]: HASH { s = 'p', x = expiry, f = failures,
-- b = blocked until, l = last failure }.
-- Model: ProgressiveDelayState::acquire / peek.

local now = now_us()
local p = policy_in_force()
if p.kind ~= 'p' then
  return { -1, p.kind }
end
local op, cost = parse_op()

local st = state_fields('s', 'x', 'f', 'b', 'l')
local f, b, l = 0, 0, 0
local existed = st[1]
if st[1] == 'p' and tonumber(st[2]) > now and op ~= 'reset' then
  f, b, l = tonumber(st[3]), tonumber(st[4]), tonumber(st[5])
elseif st[1] then
  -- Expired, of another strategy (a token bucket's STRING), or reset: the
  -- key is fresh.
  redis.call('DEL', KEYS[1])
  existed = false
end
if op ~= 'acquire' then
  cost = 0
end

local function expires_at()
  if f == 0 then
    return 0
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
  f, b, l = 0, 0, 0
end
if cost > 0 then
  f = f + cost
  l = now
  local delay = delay_of(f)
  if delay > 0 and now + delay > b then
    b = now + delay
  end
end

local allowed = 0
if now >= b then
  allowed = 1
end
local retry = 0
if b > now then
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

if cost > 0 then
  redis.call('HSET', KEYS[1], 's', 'p', 'x', fmt(e), 'f', fmt(f), 'b', fmt(b), 'l', fmt(l))
  expire(KEYS[1], e, now)
elseif existed and f == 0 then
  -- Reset, forgotten, or another strategy's state: the key is fresh.
  redis.call('DEL', KEYS[1])
end
return { allowed, p.free, remaining, retry, reset, p.forget }
