-- tollgate: composite, one all-or-nothing decision over up to 4 token
-- buckets, sliding windows (never penalising) and calendar quotas.
--
-- KEYS and ARGV: see common.lua; the last four keys are the parts' logs:
-- KEYS[#KEYS - 4 + i]  <prefix>:<limiter>:{<key>}:log<i>, i = 1 .. 4   LIST
-- Every key shares the hash tag: one cluster slot.
-- State, KEYS[1]: HASH { s = 'c', x = expiry, and per part i (from 1)
-- k<i> = 't' | 'w' | 'q', v<i> = tat (token bucket), total cost in log<i>
-- (sliding window) or units used (calendar quota, whose window is
-- a<i> = start, e<i> = end), b<i> = born, the part's life: a token
-- bucket's first reservation (0 until then; TokenBucketState::born), a
-- window's first event, a calendar quota's when its count began (absent
-- counts as 0), and for
-- a token bucket r<i> = its life's refunds, as token_bucket.lua stores
-- them after born (absent, or '0', for none), for a sliding window t<i> =
-- when the newest event its bounded log dropped leaves the window (absent
-- for none: see sliding_window.lua's t) }.
-- ARGV[5] carries the calendar parts' bounds (see common.lua). A reserve
-- appends, per part, its mark: born, then the tat after the charge plus
-- the life's refunds (token bucket) or the entry's timestamp (window); for
-- a calendar quota, the window's start, then when its count began; then
-- the interval a token bucket's units were charged at (0 for the other
-- strategies). A settle settles each part on
-- its own, then answers '?1'. A part's log is a sliding window's (see
-- sliding_window.lua). On every write, all the keys get one TTL: the
-- composite's expiry, the latest of its parts'.
-- Every part first answers as a peek; only if all pass are all charged.
-- Returns common.lua's reply plus a 7th item: the binding part (from 0).
-- Model: CompositeState::apply and composite::combine; each part's settle
-- is TokenBucketState::settle / SlidingWindowState::settle /
-- CalendarState::settle (common_calendar.lua's calendar_settle).

local now = now_us()
local p = policy_in_force(4)
if p.kind ~= 'c' then
  return { -1, p.kind }
end
local parts = p.parts
local n = #parts
-- Every calendar part's window must be known before anything is read.
local missing = {}
for i = 1, n do
  if parts[i].kind == 'q' and not calendar_window(parts[i], now) then
    missing[#missing + 1] = parts[i].spec
  end
end
if #missing > 0 then
  return { -2, fmt(now), unpack(missing) }
end
local op, cost, settle = parse_op(now)
-- The parts' logs are the last four keys (see the head of this file).
local logs_at = #KEYS - 4
local function log_key(i)
  return KEYS[logs_at + i]
end
-- Part i's field names, k<i> v<i> a<i> e<i> b<i> r<i> t<i>, are
-- FIELDS[7 * i - 6 .. 7 * i], constants: 'k' .. i formats i with sprintf
-- (~2,500 instructions a name), and a decision names each part's fields a
-- dozen times. Parts beyond 4 (a composite the client never sends) are
-- named as they come.
local FIELDS = {
  'k1', 'v1', 'a1', 'e1', 'b1', 'r1', 't1',
  'k2', 'v2', 'a2', 'e2', 'b2', 'r2', 't2',
  'k3', 'v3', 'a3', 'e3', 'b3', 'r3', 't3',
  'k4', 'v4', 'a4', 'e4', 'b4', 'r4', 't4',
}
for i = 5, n do
  for _, f in ipairs({ 'k', 'v', 'a', 'e', 'b', 'r', 't' }) do
    FIELDS[#FIELDS + 1] = f .. i
  end
end

local h = {}
-- A token bucket's STRING state (WRONGTYPE) reads as another strategy's:
-- no field. Any other error fails the call (see common.lua's state_fields).
local raw = redis.pcall('HGETALL', KEYS[1])
-- Whether another strategy's STRING is there (read as no field).
local other = false
if raw.err then
  if string.sub(raw.err, 1, 9) ~= 'WRONGTYPE' then
    error(raw)
  end
  raw, other = {}, true
end
for i = 1, #raw, 2 do
  h[raw[i]] = raw[i + 1]
end
local live = h.s == 'c' and tonumber(h.x) > now and op ~= 'reset'
if not live then
  -- Expired, of another strategy, or reset: every part is fresh. Deleted
  -- only when something is there: a DEL is a write even when it finds
  -- nothing, after which a Redis out of memory lets the script write a new
  -- key past maxmemory (see sliding_window.lua; EXISTS denied: deleted).
  if other or next(h)
    or redis.pcall('EXISTS', log_key(1), log_key(2), log_key(3), log_key(4)) ~= 0 then
    redis.call('DEL', KEYS[1], log_key(1), log_key(2), log_key(3), log_key(4))
  end
  h = {}
end
-- No part penalises: a penalty records nothing and answers a peek of 1.
if op == 'reset' or op == 'penalise' then
  op, cost = 'peek', 1
end

-- Parts beyond the list are forgotten, and a part whose strategy changed
-- starts fresh (the model's State::apply).
local function forget(i)
  redis.call('DEL', log_key(i))
  if live then
    redis.call('HDEL', KEYS[1], unpack(FIELDS, 7 * i - 6, 7 * i))
  end
end
for i = n + 1, 4 do
  if h[FIELDS[7 * i - 6]] then
    forget(i)
  end
end

-- A settle: each part settles its own share (the parts' settle in the
-- model), in h and the logs; the parts then answer '?1' below, and every
-- part is written back with the composite's expiry.
local settling = op == 'settle'
if settling then
  local units, actual = cost, settle.actual
  for i = 1, n do
    local q, m = parts[i], settle.marks[i]
    local k_i, v_i, a_i, e_i, b_i, r_i, t_i = unpack(FIELDS, 7 * i - 6, 7 * i)
    if h[k_i] and h[k_i] ~= q.kind then
      forget(i)
    end
    if h[k_i] ~= q.kind then
      h[k_i], h[v_i], h[b_i], h[r_i] = q.kind, '0', '0', nil
      h[t_i] = nil
    end
    local v, born = tonumber(h[v_i]), tonumber(h[b_i] or '0')
    if q.kind == 'q' then
      local c = { a = 0, e = 0, n = v, b = born }
      if v > 0 then
        c.a, c.e = tonumber(h[a_i]), tonumber(h[e_i])
      end
      calendar_settle(q, c, now, units, actual, m)
      v, born = c.n, c.b
      h[a_i], h[e_i] = fmt(c.a), fmt(c.e)
    elseif q.kind == 't' then
      local stored = h[r_i]
      local r = parse_refunds(stored)
      v, born, r = bucket_settle(q, v, born, r, now, units, actual, m)
      -- '0' where refunds were stored and are no more (a new life).
      h[r_i] = fmt_refunds(r) or (stored and '0')
    else
      local w, limit, key = q.window, q.limit, log_key(i)
      local total = v
      local clamped = now
      local last_ts = nil
      if total > 0 then
        local tail = redis.call('LRANGE', key, -2, -1)
        if #tail == 2 then
          last_ts = tonumber(tail[1])
          if last_ts > clamped then
            clamped = last_ts
          end
        else
          redis.call('DEL', key)
          total = 0
        end
      end
      -- Events that left the window go first.
      if total > 0 then
        local drop = each_event(key, function(ts, c)
          if ts + w > clamped then
            return true
          end
          total = total - c
          return false
        end)
        if drop > 0 then
          redis.call('LTRIM', key, drop, -1)
        end
        if total == 0 then
          redis.call('DEL', key)
          last_ts = nil
        end
      end
      if actual > units then
        -- The excess, now, at most limit; then the newest events holding
        -- at least limit are kept (sliding_window.lua's record).
        local c = actual - units
        if c > limit then
          c = limit
        end
        -- The total saturates at MAX_COUNT (the model's record).
        if c > MAX_COUNT - total then
          c = MAX_COUNT - total
        end
        if c > 0 and total == 0 then
          born = clamped
        end
        if c <= 0 then
          -- Nothing recorded.
        elseif last_ts == clamped then
          local merged = tonumber(redis.call('LINDEX', key, -1)) + c
          redis.call('LSET', key, -1, fmt(merged))
        else
          redis.call('RPUSH', key, fmt(clamped), fmt(c))
        end
        total = total + c
        if total > limit then
          local drop = each_event(key, function(ts, hc)
            if total - hc >= limit then
              total = total - hc
              -- No refund until it leaves the window (sliding_window.lua).
              if ts + w > tonumber(h[t_i] or '0') then
                h[t_i] = fmt(ts + w)
              end
              return false
            end
            return true
          end)
          if drop > 0 then
            redis.call('LTRIM', key, drop, -1)
          end
        end
      elseif actual < units and m and m.born == born and total > 0
        and tonumber(h[t_i] or '0') <= now then
        total = total - (refund_event(key, m.at, units - actual) or 0)
      end
      v = total
    end
    h[v_i], h[b_i] = fmt(v), fmt(born)
  end
  op, cost = 'peek', 1
end

-- Per part: its current state, its answer as a peek, and (sliding
-- windows) the clamped now and the newest event.
local st = {}
for i = 1, n do
  local q = parts[i]
  -- rf: a token bucket's refunds as stored (parsed only when needed).
  local s = { kind = q.kind, v = 0, born = 0 }
  local k_i, v_i, a_i, e_i, b_i, r_i, t_i = unpack(FIELDS, 7 * i - 6, 7 * i)
  if h[k_i] == q.kind then
    s.v = tonumber(h[v_i])
    s.born = tonumber(h[b_i] or '0')
    s.rf = h[r_i]
    s.tr = h[t_i]
  elseif h[k_i] then
    forget(i)
  end
  if q.kind == 'q' then
    local c = { a = 0, e = 0, n = 0, b = 0 }
    if s.v > 0 then
      c = { a = tonumber(h[a_i]), e = tonumber(h[e_i]), n = s.v, b = s.born }
    end
    s.r, s.w = calendar_decide(q, c, now, cost)
  elseif q.kind == 't' then
    local t = q.interval
    local tau = q.capacity * t
    local tat = s.v
    if tat < now then
      tat = now
    end
    local debt = tat - now
    local remaining = 0
    if tau > debt then
      remaining = idiv(tau - debt, t)
    end
    s.tat = tat
    if cost > q.capacity then
      s.r = { 2, q.capacity, remaining, 0, debt, tau }
    else
      local new_debt = debt + cost * t
      if new_debt > tau then
        s.r = { 0, q.capacity, remaining, new_debt - tau, debt, tau }
      else
        s.r = { 1, q.capacity, remaining, 0, debt, tau }
        s.new_debt = new_debt
      end
    end
  else
    local w, limit, key = q.window, q.limit, log_key(i)
    local total = s.v
    local clamped = now
    local last_ts = nil
    if total > 0 then
      local tail = redis.call('LRANGE', key, -2, -1)
      if #tail == 2 then
        last_ts = tonumber(tail[1])
        if last_ts > clamped then
          clamped = last_ts
        end
      else
        -- A total without its log cannot be trusted: start afresh.
        forget(i)
        total = 0
      end
    end
    -- Events leave the window at ts + w <= clamped; none has while the
    -- part's life is younger than a window (sliding_window.lua).
    if total > 0 and (s.born or 0) + w <= clamped
      and tonumber(redis.call('LINDEX', key, 0)) + w <= clamped then
      local drop = each_event(key, function(ts, c)
        if ts + w > clamped then
          return true
        end
        total = total - c
        return false
      end)
      redis.call('LTRIM', key, drop, -1)
      if total == 0 then
        last_ts = nil
        redis.call('DEL', key)
      end
      if live then
        redis.call('HSET', KEYS[1], v_i, fmt(total))
      end
    end
    s.v, s.clamped, s.last_ts = total, clamped, last_ts
    local reset = 0
    if last_ts then
      reset = last_ts + w - clamped
    end
    local remaining = 0
    if limit > total then
      remaining = limit - total
    end
    if cost > limit then
      s.r = { 2, limit, remaining, 0, reset, w }
    elseif total + cost <= limit then
      s.r = { 1, limit, remaining, 0, reset, w }
    else
      -- total - limit first: total + cost may pass 2^53, and round.
      local needed = (total - limit) + cost
      local freed = 0
      local retry = w
      each_event(key, function(ts, c)
        freed = freed + c
        if freed >= needed then
          retry = ts + w - clamped
          return true
        end
        return false
      end)
      s.r = { 0, limit, remaining, retry, reset, w }
    end
  end
  st[i] = s
end

-- The binding answer (composite::combine): the first impossible part;
-- else, all passing, the fewest remaining; else the latest retry-after.
local function combine()
  local best = nil
  for i = 1, n do
    if st[i].r[1] == 2 then
      best = i
      break
    end
  end
  if not best then
    local all = true
    for i = 1, n do
      if st[i].r[1] ~= 1 then
        all = false
      end
    end
    for i = 1, n do
      local r = st[i].r
      if all then
        if not best or r[3] < st[best].r[3] then
          best = i
        end
      elseif r[1] == 0 and (not best or r[4] > st[best].r[4]) then
        best = i
      end
    end
  end
  local r = st[best].r
  return { r[1], r[2], r[3], r[4], r[5], r[6], best - 1 }
end

-- Appends part i's stored fields (its kind, value and birth; a token
-- bucket's refunds) to `fields`, and answers the later of `expires_at`
-- and the part's expiry `e`.
local function put_part(fields, i, e, expires_at)
  local q, s = parts[i], st[i]
  local k_i, v_i, _, _, b_i, r_i, t_i = unpack(FIELDS, 7 * i - 6, 7 * i)
  fields[#fields + 1] = k_i
  fields[#fields + 1] = q.kind
  fields[#fields + 1] = v_i
  fields[#fields + 1] = fmt(s.v)
  fields[#fields + 1] = b_i
  fields[#fields + 1] = fmt(s.born)
  if s.rf then
    fields[#fields + 1] = r_i
    fields[#fields + 1] = s.rf
  end
  if s.tr then
    fields[#fields + 1] = t_i
    fields[#fields + 1] = s.tr
  end
  if e > expires_at then
    return e
  end
  return expires_at
end

-- Writes the composite's HASH (`fields`, and its expiry) and gives it and
-- its parts' logs that expiry: they expire together. A composite whose
-- expiry has passed is as good as fresh: every key is dropped instead.
local function write_back(fields, expires_at)
  if expires_at <= now then
    redis.call('DEL', KEYS[1], log_key(1), log_key(2), log_key(3), log_key(4))
    return
  end
  fields[#fields + 1] = 'x'
  fields[#fields + 1] = fmt(expires_at)
  redis.call('HSET', KEYS[1], unpack(fields))
  local ms = ttl_ms(expires_at, now)
  redis.call('PEXPIRE', KEYS[1], ms)
  for i = 1, n do
    if parts[i].kind == 'w' then
      redis.call('PEXPIRE', log_key(i), ms)
    end
  end
end

local all = true
for i = 1, n do
  if st[i].r[1] ~= 1 then
    all = false
  end
end
if settling then
  -- A write either way: every part, and the composite's expiry (the
  -- latest of its parts'); a key as good as fresh is dropped.
  local expires_at = 0
  local fields = { 's', 'c' }
  for i = 1, n do
    local q, s = parts[i], st[i]
    local e = 0
    if q.kind == 'q' then
      -- The count lives until its window ends.
      if s.v > 0 then
        local a_i, e_i = FIELDS[7 * i - 4], FIELDS[7 * i - 3]
        e = tonumber(h[e_i])
        fields[#fields + 1] = a_i
        fields[#fields + 1] = h[a_i]
        fields[#fields + 1] = e_i
        fields[#fields + 1] = h[e_i]
      end
    elseif q.kind == 't' then
      e = s.v
    elseif s.last_ts then
      e = s.last_ts + q.window
    end
    expires_at = put_part(fields, i, e, expires_at)
  end
  write_back(fields, expires_at)
  return combine()
end
if op ~= 'acquire' or not all then
  return combine()
end

-- Charge every part, then give every key the composite's expiry.
local expires_at = 0
local fields = { 's', 'c' }
for i = 1, n do
  local q, s = parts[i], st[i]
  local part_expiry
  if q.kind == 'q' then
    s.v = s.w[3]
    s.born = s.w[5]
    -- Its mark: the window's start, and when its count began.
    s.mark_born, s.mark = s.w[1], s.w[5]
    part_expiry = s.w[2]
    fields[#fields + 1] = FIELDS[7 * i - 4]
    fields[#fields + 1] = fmt(s.w[1])
    fields[#fields + 1] = FIELDS[7 * i - 3]
    fields[#fields + 1] = fmt(s.w[2])
    s.r = { 1, q.limit, s.r[3] - cost, 0, s.w[4], s.r[6] }
  elseif q.kind == 't' then
    local t = q.interval
    local tau = q.capacity * t
    local new_tat = now + s.new_debt
    if s.v <= now then
      -- A full bucket: a new life, unnamed until its first reservation.
      s.born = 0
      if s.rf then
        s.rf = '0'
      end
    end
    if RESERVE and s.born == 0 then
      -- The life's first reservation names it, at least 1: 0 is unnamed
      -- (TokenBucketState::reserved).
      s.born = now > 0 and now or 1
    end
    s.v = new_tat
    s.mark, s.per = new_tat, t
    if s.rf then
      s.mark = new_tat + parse_refunds(s.rf).n
    end
    part_expiry = new_tat
    s.r = { 1, q.capacity, idiv(tau - s.new_debt, t), 0, s.new_debt, tau }
  else
    local w, key = q.window, log_key(i)
    if s.v == 0 then
      -- An empty log: a new life.
      s.born = s.clamped
    end
    s.mark = s.clamped
    if s.last_ts == s.clamped then
      local c = tonumber(redis.call('LINDEX', key, -1)) + cost
      redis.call('LSET', key, -1, fmt(c))
    else
      redis.call('RPUSH', key, fmt(s.clamped), fmt(cost))
    end
    s.v = s.v + cost
    part_expiry = s.clamped + w
    local remaining = 0
    if q.limit > s.v then
      remaining = q.limit - s.v
    end
    -- The newest event is now: it resets one window from now.
    s.r = { 1, q.limit, remaining, 0, w, w }
  end
  expires_at = put_part(fields, i, part_expiry, expires_at)
end
-- A charge leaves every part's expiry after now: always a write.
write_back(fields, expires_at)
local reply = combine()
if RESERVE then
  for i = 1, n do
    reply[#reply + 1] = st[i].mark_born or st[i].born
    reply[#reply + 1] = st[i].mark
    reply[#reply + 1] = st[i].per or 0
  end
end
return reply
