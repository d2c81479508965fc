-- tollgate: calendar quota (a fixed window per calendar day, week or month
-- of a time zone), one decision.
--
-- KEYS and ARGV: see common.lua (two keys: state, key override; a
-- penalty records nothing and answers a peek of 1). ARGV[5] carries the
-- window bounds the client computed: the script does no time-zone
-- arithmetic, it picks the window holding its own now among them.
-- State, KEYS[1]: HASH { s = 'q', x = expiry, which is the window's end,
-- a = the window's start, n = units used in it, b = when that count began:
-- the first charge since the window opened or the key was reset (absent
-- counts as 0) }. The key expires at the end of its window: the next window
-- starts from zero. A reserve appends its mark: the window's start, then
-- when its count began. A settle refunds or charges (common_calendar.lua's
-- calendar_settle), then answers '?1'.
-- Model: CalendarState::acquire / peek / settle.

local now = now_us()
local p = policy_in_force(0)
if p.kind ~= 'q' then
  return { -1, p.kind }
end
if not calendar_window(p, now) then
  return { -2, fmt(now), p.spec }
end
local op, cost, settle = parse_op(now)

local st = state_fields('s', 'x', 'a', 'n', 'b')
local s = { a = 0, e = 0, n = 0, b = 0 }
if st[1] == 'q' and tonumber(st[2]) > now and op ~= 'reset' then
  s = { a = tonumber(st[3]), e = tonumber(st[2]), n = tonumber(st[4]), b = tonumber(st[5] or '0') }
elseif st[1] then
  -- Expired, of another strategy, or reset: the key is fresh.
  redis.call('DEL', KEYS[1])
end
if op == 'settle' then
  calendar_settle(p, s, now, cost, settle.actual, settle.marks[1])
  if s.n > 0 then
    -- The count lives until its window ends.
    redis.call('HSET', KEYS[1], 's', 'q', 'x', fmt(s.e), 'a', fmt(s.a), 'n', fmt(s.n), 'b', fmt(s.b))
    expire(KEYS[1], s.e, now)
  elseif st[1] then
    -- Everything refunded: as good as fresh.
    redis.call('DEL', KEYS[1])
  end
end
if op == 'reset' or op == 'penalise' or op == 'settle' then
  op, cost = 'peek', 1
end

local r, w = calendar_decide(p, s, now, cost)
if op == 'peek' or not w then
  return r
end
redis.call('HSET', KEYS[1], 's', 'q', 'x', fmt(w[2]), 'a', fmt(w[1]), 'n', fmt(w[3]), 'b', fmt(w[5]))
expire(KEYS[1], w[2], now)
local reply = { 1, p.limit, r[3] - cost, 0, w[4], r[6] }
if RESERVE then
  reply[7], reply[8], reply[9] = w[1], w[5], 0
end
return reply
