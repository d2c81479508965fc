-- tollgate: helpers shared by every strategy script.
--
-- This file is prepended to sliding_window.lua, progressive_delay.lua,
-- calendar.lua, composite.lua and concurrency.lua, and spliced into
-- token_bucket.lua after its acquire path, for its other operations (see
-- src/scripts.rs); it is never loaded alone. Every script takes the same
-- KEYS and ARGV, each only the keys it uses:
--
-- KEYS[1]  state     <prefix>:<limiter>:{<key>}            HASH (STRING for a
--            token bucket, see token_bucket.lua: a script of another
--            strategy reads it as another strategy's state, see
--            state_fields below)
--            s  strategy of the stored state: 'w' | 'p' | 'q' | 'c' | 'n'
--               ('t': a token bucket written before its STRING state)
--            x  expiry (µs): from then on the key reads as fresh
--            (+ the strategy's own fields)
-- KEYS[2]  key ovr   <prefix>:<limiter>:{<key>}:override   STRING (encoded policy);
--          token_bucket.lua takes it only on a limiter with per-key
--          overrides (see there), the other scripts always
-- KEYS[3]  sliding_window.lua: the log, <prefix>:<limiter>:{<key>}:log (LIST);
--          composite.lua: KEYS[3..6], its parts' logs :log1 .. :log4;
--          concurrency.lua: the slots, :slots (ZSET); token_bucket.lua:
--          none (it takes at most two keys)
-- Every key carries the {<key>} hash tag: one cluster slot. The limiter-wide
-- override (<prefix>:<limiter>:override) is not a key of any script: the
-- client reads it (and caches it, RedisBackendBuilder::override_cache_ttl)
-- and sends it as ARGV[2].
--
-- ARGV[1]  the operation (parsed by parse_op below):
--            '<n>'   acquire n units (0 counts as 1: every charge charges)
--            '?<n>'  peek: would n units fit? changes nothing (0 counts as 1)
--            '!<n>'  penalise: record n refused units (penalised sliding
--                    windows only, at most limit of them); answers '?1'
--            '-1'    reset the key; answers '?1'
--            'r<n>'  reserve: acquire n, and append to the reply where the
--                    units sit (see RESERVE below)
--            's<units>:<actual>:<m1>:..:<mk>'  settle a reservation of
--                    <units> that cost <actual>: refund the unused units
--                    still held, or charge the excess; answers '?1'. Each
--                    mi is a part's mark '<born>,<at>[,<interval>]', or
--                    '-' for none
--                    (model: strategy/reservation.rs)
--            'h<id>' hold concurrency slot <id> (concurrency.lua); any
--                    other script answers '?1'
--            'x<id>' release concurrency slot <id> (concurrency.lua); any
--                    other script answers '?1'
-- ARGV[2]  the policy, encoded (see decode below): the limiter-wide override
--          known to the client, else the limiter's configured policy. A
--          per-key override (KEYS[2]) takes precedence over it.
-- ARGV[3]  now in µs since the epoch, or '' (or absent) to use the server's
--          TIME
-- ARGV[4]  the least TTL in ms to give a written key (0 or absent in
--          production; a floor for tests whose caller clock runs slower
--          than real time)
-- ARGV[5]  calendar bounds, computed by the client (the scripts do no
--          time-zone arithmetic), one entry per calendar period and zone,
--          separated by spaces: '<spec>,<b0>,<b1>,<b2>,<b3>', where spec is
--          '<d|w|m>:<zone>' and b0 < b1 < b2 < b3 are window starts in µs
--          (previous, current, next window, and the next one's end) around
--          the client's clock. The script picks, by its own now, the window
--          [b_i, b_i+1) that holds it; when none does (or the policy in
--          force has a spec the client did not send), it answers
--          {-2, now, spec...}: the client computes those specs' bounds
--          around that now and calls again. '' or absent when no calendar
--          is known.
-- Trailing ARGV equal to their default ('', 0, '') are not sent: in
-- production a token bucket's call is 1 key (2 on a limiter with per-key
-- overrides) and 2 arguments.
--
-- Returns {verdict, limit, remaining, retry_after_us, reset_after_us,
-- window_us}: verdict 1 allowed, 0 refused, 2 refused because the cost can
-- never fit the policy in force (its capacity or limit is smaller);
-- window_us is the span the policy in force is expressed over (a calendar
-- quota's current window; composite.lua adds a 7th item: the index, from 0,
-- of the binding part). A reserve that passed appends, per part, its mark:
-- born, at (see each script), and the interval its units were charged at
-- (a token bucket's; 0 for the other strategies). Or
-- {-1, strategy} when the policy in force is of another strategy than
-- this script's: the client then runs that strategy's script. (The token
-- bucket's plain acquire under the policy sent answers one integer
-- instead: see token_bucket.lua.)
--
-- Arithmetic is the reference model's (tollgate-limiter src/model.rs), in the
-- same order, on integers below 2^53 (exact in a Lua double), written with
-- string.format('%d'), never tostring (which would write 1e+15):

-- floor(a / b) for non-negative integers, exact: the double quotient can
-- round up to the next integer, so correct it by one.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- The TTL in ms of a key whose state expires at expires_at (µs): the time
-- until then, rounded up to a millisecond so Redis never drops it before
-- the script would, and at least ARGV[4] (the tests' floor, above).
local function ttl_ms(expires_at, now)
  local ms = math.floor((expires_at - now + 999) / 1000)
  if ARGV[4] and ms < tonumber(ARGV[4]) then
    ms = tonumber(ARGV[4])
  end
  return string.format('%d', ms)
end

local function fmt(x)
  return string.format('%d', x)
end

-- Whether this acquire is a reservation (its reply carries the marks).
local RESERVE = false

-- The operation of ARGV[1]: 'acquire' | 'peek' | 'penalise' | 'reset' |
-- 'settle', and its number (at least 1 except for a penalty; a settle's is
-- the units reserved, and a third value { actual, marks = { [i] = {born,
-- at} or false } }).
local function parse_op()
  local a = ARGV[1]
  -- The common operation first: no string.sub, no tonumber.
  if a == '1' then
    return 'acquire', 1
  end
  if a == '-1' then
    return 'reset', 1
  end
  local op = 'acquire'
  local sigil = string.sub(a, 1, 1)
  if sigil == 'h' or sigil == 'x' then
    -- A concurrency slot: only concurrency.lua takes one.
    return 'peek', 1
  end
  if sigil == 's' then
    local f = {}
    for part in string.gmatch(string.sub(a, 2), '[^:]+') do
      f[#f + 1] = part
    end
    local marks = {}
    for i = 3, #f do
      -- born, at, and (a token bucket's) the interval the units were
      -- charged at; a receipt made before it had two numbers (per 0).
      local b, at, per = string.match(f[i], '^(%d+),(%d+),?(%d*)$')
      if b then
        marks[i - 2] = { born = tonumber(b), at = tonumber(at), per = tonumber(per) or 0 }
      else
        marks[i - 2] = false
      end
    end
    return 'settle', tonumber(f[1]), { actual = tonumber(f[2]), marks = marks }
  end
  if sigil == 'r' then
    RESERVE = true
    a = string.sub(a, 2)
  elseif sigil == '?' then
    op = 'peek'
  elseif sigil == '!' then
    op = 'penalise'
  end
  if op ~= 'acquire' then
    a = string.sub(a, 2)
  end
  local n = tonumber(a)
  if op ~= 'penalise' and n < 1 then
    n = 1
  end
  return op, n
end

-- The operation of ARGV[1] for concurrency.lua: 'hold' | 'release' and
-- the slot id (a string), or parse_op's answer.
local function parse_slot_op()
  local sigil = string.sub(ARGV[1], 1, 1)
  if sigil == 'h' then
    return 'hold', string.sub(ARGV[1], 2)
  elseif sigil == 'x' then
    return 'release', string.sub(ARGV[1], 2)
  end
  return parse_op()
end

local function now_us()
  if ARGV[3] and ARGV[3] ~= '' then
    return tonumber(ARGV[3])
  end
  -- TIME's two fields are digits: arithmetic makes them numbers as
  -- tonumber would, without its call (~1,000 instructions each).
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end

-- Policy encoding, version 1 (fields joined by ':'):
--   1:t:<capacity>:<refill>:<period_us>:<interval_us>   token bucket
--   2:t:<capacity>:<interval_us>:<refill>:<period_us>   the same, as the
--       client sends it (ARGV[2]; stored overrides stay version 1)
--   1:w:<limit>:<window_us>:<penalise 0|1>              sliding window
--   1:p:<free>:<base_us>:<factor>:<max_us>:<forget_us>  progressive delay
--   1:q:<limit>:<d|w|m>:<zone>                          calendar quota
--   1:c|<part>|<part>...  composite: each part a t, w or q encoding without '1:'
--   1:n:<max_in_flight>:<lease_us>                      concurrency
local function decode(enc)
  -- The single-strategy shapes in one match each, without the field table
  -- the general path builds: this runs on every decision. A zero (or a
  -- leading zero) does not match them: the general path refuses it. What
  -- they capture is digits: `+ 0` makes them numbers as tonumber would,
  -- without its call (~1,000 instructions each).
  local a, b, c = string.match(enc, '^2:t:([1-9]%d*):([1-9]%d*):%d+:%d+$')
  if not a then
    a, b = string.match(enc, '^1:t:([1-9]%d*):%d+:%d+:([1-9]%d*)$')
  end
  if a then
    return { kind = 't', capacity = a + 0, interval = b + 0 }
  end
  a, b, c = string.match(enc, '^1:w:([1-9]%d*):([1-9]%d*):([01])$')
  if a then
    return { kind = 'w', limit = a + 0, window = b + 0, penalise = c == '1' }
  end
  if string.sub(enc, 1, 4) == '1:c|' then
    local parts = {}
    for part in string.gmatch(string.sub(enc, 5), '[^|]+') do
      parts[#parts + 1] = decode('1:' .. part)
    end
    if #parts == 0 then
      error('tollgate: invalid policy encoding')
    end
    return { kind = 'c', parts = parts }
  end
  -- A field that must be a whole number of at least 1. A stored override
  -- is written by clients that validate it, but also by hand (redis-cli):
  -- one no constructor accepts is refused, not enforced (a zero window
  -- admitted every request). `ge` lowers the bound (a progressive delay's
  -- free attempts may be 0). Built here, past the shapes matched above:
  -- a closure costs ~450 instructions per call of the script.
  local function whole(v, ge)
    local n = tonumber(v)
    if not n or n < (ge or 1) or n ~= math.floor(n) then
      error('tollgate: invalid policy encoding')
    end
    return n
  end
  local f = {}
  for part in string.gmatch(enc, '[^:]+') do
    f[#f + 1] = part
  end
  if f[1] ~= '1' then
    error('tollgate: unknown policy encoding version')
  end
  local kind = f[2]
  if kind == 't' then
    return { kind = kind, capacity = whole(f[3]), interval = whole(f[6]) }
  elseif kind == 'w' then
    return { kind = kind, limit = whole(f[3]), window = whole(f[4]), penalise = f[5] == '1' }
  elseif kind == 'q' then
    return { kind = kind, limit = whole(f[3]), spec = f[4] .. ':' .. f[5] }
  elseif kind == 'p' then
    return {
      kind = kind,
      free = whole(f[3], 0),
      base = whole(f[4]),
      factor = whole(f[5]),
      max = whole(f[6]),
      forget = whole(f[7]),
    }
  elseif kind == 'n' then
    return { kind = kind, max = whole(f[3]), lease = whole(f[4]) }
  end
  error('tollgate: unknown strategy in policy encoding')
end

-- The policy in force: the key's override (KEYS[2]), else the one the
-- client sent (ARGV[2]: the limiter-wide override it knows, else the
-- configured policy).
local function policy_in_force()
  return decode(redis.call('GET', KEYS[2]) or ARGV[2])
end

-- The fields of the state HASH at KEYS[1] (HMGET). A token bucket's STRING
-- state there (token_bucket.lua) reads as another strategy's state, { '' }:
-- present, so the caller deletes it before it writes its HASH. Any other
-- error is raised: read as a fresh key, an error such as a command an ACL
-- denies would admit every request without a word. (That test is written
-- out here and where composite.lua and token_bucket_ops.lua read their
-- state, not shared as a function: a closure costs ~450 instructions per
-- call of the script.)
local function state_fields(...)
  local st = redis.pcall('HMGET', KEYS[1], ...)
  if st.err then
    if string.sub(st.err, 1, 9) ~= 'WRONGTYPE' then
      error(st)
    end
    return { '' }
  end
  return st
end

-- Sets the TTL of a written key (see ttl_ms).
local function expire(key, expires_at, now)
  redis.call('PEXPIRE', key, ttl_ms(expires_at, now))
end

-- Visits the sliding-window log at `key` (pairs ts, cost; oldest first), a
-- chunk of 256 items at a time, until visit(ts, cost) returns true; returns
-- the number of list items before the event it stopped at (all of them if
-- it never did). Reads are bounded by the events visited, not the log.
local function each_event(key, visit)
  local idx = 0
  while true do
    local chunk = redis.call('LRANGE', key, idx, idx + 255)
    if #chunk == 0 then
      return idx
    end
    for i = 1, #chunk, 2 do
      if visit(tonumber(chunk[i]), tonumber(chunk[i + 1])) then
        return idx + i - 1
      end
    end
    idx = idx + #chunk
  end
end

-- A sliding window's refund of a reservation (model:
-- strategy/reservation.rs): gives back up to `units` of the event logged
-- at `at` in the log at `key`, and answers the units given back, or nil
-- when that event is gone. Shared by sliding_window.lua and composite.lua.
local function refund_event(key, at, units)
  local found = nil
  local idx = each_event(key, function(ts, c)
    if ts >= at then
      if ts == at then
        found = c
      end
      return true
    end
    return false
  end)
  if not found then
    return nil
  end
  local refund = units
  if refund > found then
    refund = found
  end
  if found == refund then
    -- Out of the list: mark the pair, then remove it.
    redis.call('LSET', key, idx, '#')
    redis.call('LSET', key, idx + 1, '#')
    redis.call('LREM', key, 2, '#')
  else
    redis.call('LSET', key, idx + 1, fmt(found - refund))
  end
  return refund
end

-- A token bucket's refunds in this life (TokenBucketState::refunded and
-- recent), from their stored form '<refunded>' then ':<at>,<amount>,<top>'
-- per remembered refund (nil or '' for none): { n = refunded, [i] = { at,
-- amount, top } }.
local function parse_refunds(v)
  local r = { n = 0 }
  if v and v ~= '' then
    local n = string.match(v, '^(%d+)')
    r.n = tonumber(n) or 0
    for at, amount, top in string.gmatch(v, ':(%d+),(%d+),(%d+)') do
      r[#r + 1] = { at = tonumber(at), amount = tonumber(amount), top = tonumber(top) }
    end
  end
  return r
end

-- The stored form of refunds r (parse_refunds's), nil when none.
local function fmt_refunds(r)
  if r.n == 0 then
    return nil
  end
  local v = fmt(r.n)
  for k = 1, #r do
    v = v .. string.format(':%d,%d,%d', r[k].at, r[k].amount, r[k].top)
  end
  return v
end

-- A token bucket's settle (TokenBucketState::settle): refund the unused
-- units not yet dripped back, in this life only (mark m: born, at = the tat
-- after the charge plus the life's refunds then), where the refunds made
-- since of reservations below it moved them: every refund of the life but
-- the remembered ones of reservations above it (TokenBucketState::remember
-- below); or charge the excess (at most capacity; a debt of at most 2
-- tau). Returns the new tat, born and refunds. Shared by token_bucket.lua
-- and composite.lua.
local MAX_REFUNDED = 2 ^ 51
local MAX_RECENT_REFUNDS = 8
local function bucket_settle(p, tat, born, refunds, now, units, actual, m)
  local t = p.interval
  local tau = p.capacity * t
  if actual < units then
    if m and m.born == born and tat > now then
      local above = 0
      for k = 1, #refunds do
        if refunds[k].at > m.at then
          above = above + refunds[k].amount
        end
      end
      local top = m.at + above - refunds.n
      -- Only what has not dripped back yet (none once the top <= now),
      -- at the interval the units were charged at: an override may have
      -- slowed the refill since (the model's TokenBucketState::settle).
      local per = t
      if m.per > 0 then
        per = m.per
      end
      local refund = (units - actual) * per
      if refund > top - now then
        refund = top - now
      end
      if refund < 0 then
        refund = 0
      end
      local old = tat
      tat = tat - refund
      if tat < now then
        tat = now
      end
      local amount = old - tat
      if amount > 0 then
        refunds.n = refunds.n + amount
        if refunds.n > MAX_REFUNDED then
          -- A new life: what is outstanding refunds nothing.
          born, refunds = now, { n = 0 }
        else
          -- Remembered while a reservation below it may still refund.
          local kept = { n = refunds.n }
          for k = 1, #refunds do
            if refunds[k].top > now then
              kept[#kept + 1] = refunds[k]
            end
          end
          refunds = kept
          if top - amount > now then
            if #refunds == MAX_RECENT_REFUNDS then
              local lowest = 1
              for k = 2, #refunds do
                if refunds[k].at < refunds[lowest].at then
                  lowest = k
                end
              end
              table.remove(refunds, lowest)
            end
            refunds[#refunds + 1] = { at = m.at, amount = amount, top = top - amount }
          end
        end
      end
    end
  elseif actual > units then
    local excess = actual - units
    if excess > p.capacity then
      excess = p.capacity
    end
    if tat <= now then
      born, refunds = now, { n = 0 }
    end
    local nt = tat
    if nt < now then
      nt = now
    end
    nt = nt + excess * t
    if nt > now + 2 * tau then
      nt = now + 2 * tau
    end
    if nt > tat then
      tat = nt
    end
  end
  return tat, born, refunds
end

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
    s.a, s.e, s.n = start, stop, used + excess
  end
end
