-- tollgate: token bucket (GCRA), one decision.
--
-- KEYS and ARGV: see common.lua (KEYS[2], the log, is unused here; a
-- penalty records nothing and answers a peek of 1).
-- State, KEYS[1]: HASH { s = 't', x = tat, b = born }: the theoretical
-- arrival time, which is also the key's expiry (the bucket is full again at
-- tat), and when this life of the key began (the first charge of a full
-- bucket; absent counts as 0). A reserve appends its mark: born, the tat
-- after the charge.
-- Model: TokenBucketState::acquire / peek / settle.

local now = now_us()
local p = policy_in_force(KEYS[4])
if p.kind ~= 't' then
  return { -1, p.kind }
end
local op, cost, settle = parse_op()
local t = p.interval
local tau = p.capacity * t

local st = redis.call('HMGET', KEYS[1], 's', 'x', 'b')
local tat, born = 0, 0
if st[1] == 't' and tonumber(st[2]) > now and op ~= 'reset' then
  tat = tonumber(st[2])
  born = tonumber(st[3] or '0')
elseif st[1] then
  -- Expired, of another strategy, or reset: the key is fresh.
  redis.call('DEL', KEYS[1])
end
if op == 'reset' or op == 'penalise' then
  op, cost = 'peek', 1
end

if op == 'settle' then
  local units, actual, m = cost, settle.actual, settle.marks[1]
  tat, born = bucket_settle(p, tat, born, now, units, actual, m)
  if tat > now then
    redis.call('HSET', KEYS[1], 's', 't', 'x', fmt(tat), 'b', fmt(born))
    expire(KEYS[1], tat, now)
  elseif st[1] then
    redis.call('DEL', KEYS[1])
  end
  op, cost = 'peek', 1
end

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

if cost > p.capacity then
  return { 2, p.capacity, remaining, 0, debt, tau }
end
-- cost <= capacity: new_debt stays within what tau holds.
local new_debt = debt + cost * t
if new_debt > tau then
  return { 0, p.capacity, remaining, new_debt - tau, debt, tau }
end
if op == 'peek' then
  return { 1, p.capacity, remaining, 0, debt, tau }
end
local new_tat = now + new_debt
redis.call('HSET', KEYS[1], 's', 't', 'x', fmt(new_tat), 'b', fmt(born))
expire(KEYS[1], new_tat, now)
local reply = { 1, p.capacity, idiv(tau - new_debt, t), 0, new_debt, tau }
if RESERVE then
  reply[7], reply[8] = born, new_tat
end
return reply
