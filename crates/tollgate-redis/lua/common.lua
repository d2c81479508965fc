-- tollgate: helpers shared by every strategy script.
--
-- This file is prepended to sliding_window.lua, progressive_delay.lua,
-- calendar.lua, composite.lua and concurrency.lua, and spliced into
-- token_bucket.lua after its acquire path, for its other operations (see
-- src/scripts.rs); it is never loaded alone. The helpers only some scripts
-- call follow it in those scripts alone: common_window.lua (sliding-window
-- logs), common_bucket.lua (token-bucket arithmetic and settles),
-- common_calendar.lua (calendar windows): every local function is built
-- on every call of a script (~450 instructions each), called or not.
-- Every script takes the same KEYS and ARGV, each only the keys it uses:
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
--          sent only on a limiter with per-key overrides (a marker the
--          client reads with the limiter-wide override, see src/lib.rs),
--          so the call of a limiter without them names only keys that
--          live and move together, which a Redis Cluster slot in
--          migration still serves (a call naming a key the slot holds and
--          one it does not, as an absent override, is answered -TRYAGAIN
--          until the migration ends)
-- then     the script's own further keys, last (`own` of them, see
--          policy_in_force): sliding_window.lua: the log,
--          <prefix>:<limiter>:{<key>}:log (LIST); composite.lua: its parts'
--          logs :log1 .. :log4; concurrency.lua: the slots, :slots (ZSET);
--          the others none
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
--                    still held, or charge the excess; answers '?1'.
--                    Both at most 2^53; only their difference is read,
--                    and the client sends it exactly (an excess at most
--                    2^53 - 1, a refund at most 2^53), moving the other
--                    number if it must. Each
--                    mi is a part's mark '<born>,<at>[,<interval>]', or
--                    '-' for none; then, when the receipt has one,
--                    '@<id>': the settle's identity (digits, kept a
--                    string). Unless units = actual (nothing to refund
--                    or charge), the key remembers it 15 minutes in
--                    <prefix>:<limiter>:{<key>}:settled (ZSET, member
--                    the id in 20 digits, score when it is forgotten in
--                    µs, read against now; the latest 1024 kept): a
--                    settle of an id remembered is a replay, answered
--                    '?1' with nothing written but that key (parse_op
--                    below)
--                    (model: strategy/reservation.rs)
--            'h<id>' hold concurrency slot <id> (concurrency.lua); any
--                    other script answers '?1'
--            'x<id>' release concurrency slot <id> (concurrency.lua); any
--                    other script answers '?1'
--            'w<id>' withdraw concurrency slot <id>: release it, and refuse
--                    a hold of <id> for one lease (concurrency.lua); any
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
-- this script's, on the same side of the concurrency boundary (see
-- policy_in_force): the client then runs that strategy's script. (The token
-- bucket's plain acquire under the policy sent answers one integer
-- instead: see token_bucket.lua.)
--
-- Arithmetic is the reference model's (tollgate-limiter src/model.rs), in the
-- same order, on integers below 2^53 (exact in a Lua double), written with
-- string.format('%d'), never tostring (which would write 1e+15):

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

-- How long a key remembers a settle's id, in µs (the model's
-- SETTLED_FOR).
local SETTLED_FOR = 900000000
-- The most settles a key remembers at once (the model's SETTLED_MAX).
local SETTLED_MAX = 1024

-- The operation of ARGV[1]: 'acquire' | 'peek' | 'penalise' | 'reset' |
-- 'settle', and its number (at least 1 except for a penalty; a settle's is
-- the units reserved, and a third value { actual, marks = { [i] = {born,
-- at} or false } }). A settle whose id the key remembers is a replay:
-- 'peek', 1 (the model's Slot::apply). Called once a script knows it
-- answers (after its redirects: { -1 } and { -2 } are answered again,
-- with the same id, by the call that follows), at `now`.
local function parse_op(now)
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
  if sigil == 'h' or sigil == 'x' or sigil == 'w' then
    -- A concurrency slot: only concurrency.lua takes one.
    return 'peek', 1
  end
  if sigil == 's' then
    local body, id = string.match(a, '^s([^@]*)@?(%d*)$')
    local f = {}
    for part in string.gmatch(body or '', '[^:]+') do
      f[#f + 1] = part
    end
    -- Not a settle at the estimate (units = actual, both digits as the
    -- client wrote them): it changes nothing, and a failed login's
    -- settle leaves no key.
    if id and id ~= '' and f[1] ~= f[2] then
      -- One sorted set a key: member the id in 20 digits (so that ties
      -- go by the number, as the model's), score when it is forgotten.
      -- Those at or before now are forgotten first (the caller's clock
      -- in the tests, ahead of the TTL); then, at most SETTLED_MAX kept,
      -- the earliest go: the work and the memory are bounded however
      -- fast a refunded client settles (the model's Settled::replayed).
      local set, till = KEYS[1] .. ':settled', now + SETTLED_FOR
      local member = string.rep('0', 20 - #id) .. id
      redis.call('ZREMRANGEBYSCORE', set, '-inf', fmt(now))
      if redis.call('ZSCORE', set, member) then
        return 'peek', 1
      end
      redis.call('ZADD', set, fmt(till), member)
      if redis.call('ZCARD', set) > SETTLED_MAX then
        -- ZPOPMIN's work, with the commands the documented ACL grants.
        redis.call('ZREM', set, redis.call('ZRANGE', set, 0, 0)[1])
      end
      -- Kept until the latest is forgotten (a clock stepping back may
      -- have remembered one out of order).
      local last = redis.call('ZRANGE', set, -1, -1, 'WITHSCORES')
      redis.call('PEXPIRE', set, ttl_ms(tonumber(last[2]), now))
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

local function now_us()
  if ARGV[3] and ARGV[3] ~= '' then
    return tonumber(ARGV[3])
  end
  -- TIME's two fields are digits: arithmetic makes them numbers as
  -- tonumber would, without its call (~1,000 instructions each).
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end

-- The largest count a key holds (policy::MAX_COUNT, 2^53 - 1): a window's
-- total and a calendar quota's count saturate at it, so that they and the
-- sums computed with them stay exact integers in a Lua number.
local MAX_COUNT = 9007199254740991

-- The longest span a policy takes, in µs (policy::MAX_SPAN_MICROS: 10
-- years).
local MAX_SPAN = 315360000000000

-- Policy encoding, version 1 (fields joined by ':'):
--   1:t:<capacity>:<refill>:<period_us>:<interval_us>   token bucket
--   2:t:<capacity>:<interval_us>:<refill>:<period_us>   the same, as the
--       client sends it (ARGV[2]; stored overrides stay version 1)
--   1:w:<limit>:<window_us>:<penalise 0|1>              sliding window
--   1:p:<free>:<base_us>:<factor>:<max_us>:<forget_us>  progressive delay
--   1:q:<limit>:<d|w|m>:<zone>                          calendar quota
--   1:c|<part>|<part>...  composite: each part a t, w or q encoding without '1:'
--   1:n:<max_in_flight>:<lease_us>                      concurrency
-- Decodes `enc`: the client's (ARGV[2], a policy it built, or decoded and
-- checked), or, `stored`, a per-key override the script read (KEYS[2]).
local function decode(enc, stored)
  -- The client's single-strategy shapes in one match each, without the
  -- field table the general path builds: this runs on every decision. A
  -- zero (or a leading zero) does not match them: the general path
  -- refuses it. What they capture is digits: `+ 0` makes them numbers as
  -- tonumber would, without its call (~1,000 instructions each).
  if not stored then
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
  end
  if string.sub(enc, 1, 4) == '1:c|' then
    local parts = {}
    for part in string.gmatch(string.sub(enc, 5), '[^|]+') do
      local q = decode('1:' .. part, stored)
      -- What Composite::new takes: at most 4 parts (a fifth has no log
      -- key: the script failed after it had pushed the others' logs,
      -- before their TTL), each a token bucket, a sliding window that
      -- does not penalise, or a calendar quota.
      if #parts == 4 or not (q.kind == 't' or q.kind == 'q' or (q.kind == 'w' and not q.penalise)) then
        error('tollgate: invalid policy encoding (composite part)')
      end
      parts[#parts + 1] = q
    end
    if #parts == 0 then
      error('tollgate: invalid policy encoding')
    end
    return { kind = 'c', parts = parts }
  end
  -- A stored override is written by clients that validate it, but also by
  -- hand (redis-cli): what encoding::decode refuses (no constructor takes
  -- it) is refused here, not enforced (a zero window admitted every
  -- request; an interval of 1 µs stored beside a refill of one token an
  -- hour, much the same). `whole` takes a whole number from `ge` (default
  -- 1) to `le` (default 2^53 - 1: a larger one is not exact in a double,
  -- and no constructor makes one), written in digits when stored. Built
  -- here, past the shapes matched above: a closure costs ~450
  -- instructions per call of the script.
  local function whole(v, ge, le)
    local n = tonumber(v)
    if not n or n < (ge or 1) or n ~= math.floor(n) or n > (le or 9007199254740991)
      or (stored and not string.match(v, '^%d+$')) then
      error('tollgate: invalid policy encoding')
    end
    return n
  end
  local f = {}
  for part in string.gmatch(enc, '[^:]+') do
    f[#f + 1] = part
  end
  local kind = f[2]
  if f[1] ~= '1' and not (f[1] == '2' and kind == 't') then
    error('tollgate: invalid policy encoding (unknown version)')
  end
  if kind == 't' then
    if #f ~= 6 then
      error('tollgate: invalid policy encoding')
    end
    local capacity, refill, period, interval
    if f[1] == '2' then
      capacity, interval, refill, period = whole(f[3]), whole(f[4]), whole(f[5]), whole(f[6], 1, MAX_SPAN)
    else
      capacity, refill, period, interval = whole(f[3]), whole(f[4]), whole(f[5], 1, MAX_SPAN), whole(f[6])
    end
    -- TokenBucket::new: at most a token a µs, the interval rounded up
    -- (exact: both below 2^53), a full refill within MAX_SPAN.
    local per = math.floor(period / refill)
    if per * refill < period then
      per = per + 1
    end
    if refill > period or interval ~= per or capacity * interval > MAX_SPAN then
      error('tollgate: invalid policy encoding')
    end
    return { kind = kind, capacity = capacity, interval = interval }
  elseif kind == 'w' then
    if #f ~= 5 or (f[5] ~= '0' and f[5] ~= '1') then
      error('tollgate: invalid policy encoding')
    end
    return { kind = kind, limit = whole(f[3]), window = whole(f[4], 1, MAX_SPAN), penalise = f[5] == '1' }
  elseif kind == 'q' then
    if #f ~= 5 or (f[4] ~= 'd' and f[4] ~= 'w' and f[4] ~= 'm') then
      error('tollgate: invalid policy encoding')
    end
    return { kind = kind, limit = whole(f[3]), spec = f[4] .. ':' .. f[5] }
  elseif kind == 'p' then
    if #f ~= 7 then
      error('tollgate: invalid policy encoding')
    end
    local p = {
      kind = kind,
      free = whole(f[3], 0),
      base = whole(f[4], 1, MAX_SPAN),
      -- Any size: a product beyond the cap is capped.
      factor = whole(f[5], 1, math.huge),
      max = whole(f[6], 1, MAX_SPAN),
      forget = whole(f[7], 1, MAX_SPAN),
    }
    if p.max < p.base then
      error('tollgate: invalid policy encoding')
    end
    return p
  elseif kind == 'n' then
    if #f ~= 4 then
      error('tollgate: invalid policy encoding')
    end
    -- concurrency::MAX_IN_FLIGHT slots at most.
    return { kind = kind, max = whole(f[3], 1, 1000000), lease = whole(f[4], 1, MAX_SPAN) }
  end
  error('tollgate: invalid policy encoding (unknown strategy)')
end

-- The policy in force: the key's override (KEYS[2], when sent: a script
-- taking `own` further keys was sent more than 1 + own), else the one the
-- client sent (ARGV[2]: the limiter-wide override it knows, else the
-- configured policy). A key's override across the concurrency boundary
-- from the policy sent (a concurrency override of a rate limiter, or a
-- rate override of a concurrency limiter: the client refuses a
-- limiter-wide one, so ARGV[2] is on the configured policy's side) is no
-- policy, refused like one that does not decode: under it every
-- operation would only look, and admit every request (model: in_force).
-- token_bucket_ops.lua makes the same test where it decodes a key's
-- override.
local function policy_in_force(own)
  local stored = #KEYS > own + 1 and redis.call('GET', KEYS[2])
  if stored then
    local p = decode(stored, true)
    if (p.kind == 'n') ~= (string.sub(ARGV[2], 1, 4) == '1:n:') then
      error('tollgate: invalid policy encoding (an override across the concurrency boundary)')
    end
    return p
  end
  return decode(ARGV[2])
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

-- Sets the TTL of a written key, and of key2 if given (the same: ttl_ms
-- computed once).
local function expire(key, expires_at, now, key2)
  local ms = ttl_ms(expires_at, now)
  redis.call('PEXPIRE', key, ms)
  if key2 then
    redis.call('PEXPIRE', key2, ms)
  end
end
