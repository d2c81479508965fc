-- tollgate: calendar-quota helpers, shared by calendar.lua and
-- composite.lua: each follows common.lua (src/scripts.rs) and runs with
-- its locals. Apart from common.lua because every local function of a
-- script is built on every call (~450 instructions each): a script
-- includes only the helpers it calls.

-- The calendar window [start, end) holding `now` for calendar quota q, from
-- the client's bounds (ARGV[5]); nil when they do not hold it.
local function calendar_window(q, now)
  for entry in string.gmatch(ARGV[5] or '', '[^ ]+') do
    local f = {}
    for x in string.gmatch(entry, '[^,]+') do
      f[#f + 1] = x
    end
    if f[1] == q.spec then
      for i = 2, 4 do
        local a, b = tonumber(f[i]), tonumber(f[i + 1])
        if a <= now and now < b then
          return a, b
        end
      end
      return nil
    end
  end
  return nil
end

-- The window a calendar decision at `now` counts in, and the units already
-- counted in it (the model's CalendarState::current). s is the stored state
-- { a = start, e = end, n = used, b = when the count began } (n = 0 for a
-- fresh key). The caller has checked that calendar_window(q, now) is known.
local function calendar_current(q, s, now)
  local start, stop
  if s.n > 0 and s.a > now then
    -- A clock that stepped back keeps counting in the stored window.
    start, stop = s.a, s.e
  else
    start, stop = calendar_window(q, now)
  end
  local used = 0
  if s.n > 0 and s.a == start and s.e == stop then
    used = s.n
  end
  return start, stop, used
end

-- A calendar quota's decision (the model's CalendarState::decide) for a
-- cost of at least 1, on the stored state s (see calendar_current).
-- Returns the reply as a peek, and when the cost fits, the state a charge
-- writes: { start, end, used, end - now, born }, born being when the count
-- began (now, if the window counted nothing yet).
local function calendar_decide(q, s, now, cost)
  local start, stop, used = calendar_current(q, s, now)
  local limit = q.limit
  local window = stop - start
  local until_end = stop - now
  local remaining = 0
  if limit > used then
    remaining = limit - used
  end
  local reset = 0
  if used > 0 then
    reset = until_end
  end
  if cost > limit then
    return { 2, limit, remaining, 0, reset, window }
  end
  if used + cost > limit then
    return { 0, limit, remaining, until_end, reset, window }
  end
  local born = s.b
  if used == 0 then
    born = now
  end
  return { 1, limit, remaining, 0, reset, window }, { start, stop, used + cost, until_end, born }
end

-- Settles a reservation of `units` that cost `actual` on calendar quota q
-- (the model's CalendarState::settle), updating s (see calendar_current) in
-- place. m is the reservation's mark { born = the window's start, at = when
-- its count began }, or false. A refund takes min(unused, used) off the
-- count while that window is the current one and its count the same (a
-- rolled window or a reset gave everything back); the excess is counted in
-- the current window, at most the limit, even beyond it.
local function calendar_settle(q, s, now, units, actual, m)
  if actual < units then
    local start, stop, used = calendar_current(q, s, now)
    if m and used > 0 and start == s.a and stop == s.e and m.born == start and m.at == s.b then
      local refund = units - actual
      if refund > used then
        refund = used
      end
      s.n = used - refund
    end
  elseif actual > units then
    local excess = actual - units
    if excess > q.limit then
      excess = q.limit
    end
    local start, stop, used = calendar_current(q, s, now)
    if used == 0 then
      s.b = now
    end
    -- At most MAX_COUNT (the model's charge): the sum may pass 2^53 and
    -- round, but then above MAX_COUNT.
    local n = used + excess
    if n > MAX_COUNT then
      n = MAX_COUNT
    end
    s.a, s.e, s.n = start, stop, n
  end
end
