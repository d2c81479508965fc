-- tollgate: token bucket (GCRA), one decision.
--
-- KEYS and ARGV: see common.lua (KEYS[2], the log, is unused here).
-- State, KEYS[1]: HASH { s = 't', x = tat }: the theoretical arrival time,
-- which is also the key's expiry (the bucket is full again at tat).
-- Model: TokenBucketState::acquire.

local now = now_us()
local p = policy_in_force()
if p.kind ~= 't' then
  return { -1, p.kind }
end
local cost = tonumber(ARGV[2])
local t = p.interval
local tau = p.capacity * t

local st = redis.call('HMGET', KEYS[1], 's', 'x')
local tat = 0
if st[1] == 't' and tonumber(st[2]) > now and cost >= 0 then
  tat = tonumber(st[2])
elseif st[1] then
  -- Expired, of another strategy, or reset: the key is fresh.
  redis.call('DEL', KEYS[1])
end
if cost < 0 then
  cost = 0
end

if tat < now then
  tat = now
end
local debt = tat - now
local remaining = 0
if tau > debt then
  remaining = idiv(tau - debt, t)
end

if cost == 0 then
  if debt + t <= tau then
    return { 1, p.capacity, remaining, 0, debt }
  end
  return { 0, p.capacity, remaining, debt + t - tau, debt }
end

if cost > (9007199254740992 - debt) / t then
  error('tollgate: cost out of range')
end
local new_debt = debt + cost * t
if new_debt <= tau then
  local new_tat = now + new_debt
  redis.call('HSET', KEYS[1], 's', 't', 'x', fmt(new_tat))
  expire(KEYS[1], new_tat, now)
  return { 1, p.capacity, idiv(tau - new_debt, t), 0, new_debt }
end
return { 0, p.capacity, remaining, new_debt - tau, debt }
