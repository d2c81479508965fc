-- tollgate: calendar quota (a fixed window per calendar day, week or month
-- of a time zone), one decision.
--
-- KEYS and ARGV: see common.lua (KEYS[2], the log, is unused here; a
-- penalty records nothing and answers a peek of 1). ARGV[6] carries the
-- window bounds the client computed: the script does no time-zone
-- arithmetic, it picks the window holding its own now among them.
-- State, KEYS[1]: HASH { s = 'q', x = expiry, which is the window's end,
-- a = the window's start, n = units used in it }. The key expires at the
-- end of its window: the next window starts from zero.
-- Model: CalendarState::acquire / peek.

local now = now_us()
local p = policy_in_force(KEYS[4])
if p.kind ~= 'q' then
  return { -1, p.kind }
end
if not calendar_window(p, now) then
  return { -2, fmt(now), p.spec }
end
local op, cost = parse_op()

local st = redis.call('HMGET', KEYS[1], 's', 'x', 'a', 'n')
local s = { a = 0, e = 0, n = 0 }
if st[1] == 'q' and tonumber(st[2]) > now and op ~= 'reset' then
  s = { a = tonumber(st[3]), e = tonumber(st[2]), n = tonumber(st[4]) }
elseif st[1] then
  -- Expired, of another strategy, or reset: the key is fresh.
  redis.call('DEL', KEYS[1])
end
if op == 'reset' or op == 'penalise' or op == 'settle' then
  op, cost = 'peek', 1
end

local r, w = calendar_decide(p, s, now, cost)
if op == 'peek' or not w then
  return r
end
redis.call('HSET', KEYS[1], 's', 'q', 'x', fmt(w[2]), 'a', fmt(w[1]), 'n', fmt(w[3]))
expire(KEYS[1], w[2], now)
return { 1, p.limit, r[3] - cost, 0, w[4], r[6] }
