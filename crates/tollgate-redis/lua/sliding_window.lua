-- tollgate: exact sliding window (a log of events), one decision.
--
-- KEYS and ARGV: see common.lua.
-- State, KEYS[1]: HASH { s = 'w', x = expiry, n = total cost in the log,
-- b = born: when this life began, the first event in an empty log (absent
-- counts as 0), t = when the newest event the bounded log dropped leaves
-- the window (absent counts as 0): no refund before then }. A reserve appends its mark: born, the timestamp of the
-- entry holding its units.
-- Log, the last key (KEYS[3], or KEYS[2] when no override is sent): LIST
-- of pairs, oldest first: ts1, cost1, ts2, cost2, ... (timestamps
-- non-decreasing; events at one instant are merged). Both keys
-- share the hash tag and the TTL.
-- Bounded log: whenever an event is recorded, the oldest events are dropped
-- while the newer ones alone hold at least `limit` units, which changes no
-- answer (see SlidingWindowState in the model), as long as no refund
-- takes units out of the kept events before the dropped ones leave the
-- window: a settle refunds nothing until then (t). A penalised flood thus
-- keeps at most `limit` events, and every decision reads at most that many: work
-- and memory are bounded by the policy, not by the number of requests.
-- Model: SlidingWindowState::acquire / peek / penalise / settle.

local now = now_us()
local p = policy_in_force(1)
local LOG = KEYS[#KEYS]
if p.kind ~= 'w' then
  return { -1, p.kind }
end
local op, cost, settle = parse_op(now)
local w, limit = p.window, p.limit

local st = state_fields('s', 'x', 'n', 'b', 't')
local live = st[1] == 'w' and tonumber(st[2]) > now and op ~= 'reset'
local total, born, trimmed_until = 0, 0, 0
if live then
  total = tonumber(st[3])
  born = tonumber(st[4] or '0')
  trimmed_until = tonumber(st[5] or '0')
elseif (st[1] or redis.pcall('EXISTS', LOG)) ~= 0 then
  -- Fresh: drop an expired log, another strategy's state, or (reset) ours.
  -- Only when there is one: a DEL that finds nothing is still a write, and
  -- once a script has written, a Redis out of memory lets it write on, so a
  -- new key would grow past maxmemory (docs/redis.md, "When Redis
  -- refuses"); the EXISTS costs what that DEL did. A user without +exists
  -- (an ACL from before) gets its error, and the DEL as before.
  redis.call('DEL', KEYS[1], LOG)
end
if op == 'reset' then
  op = 'peek'
end

-- The newest event; now is clamped to it so the log stays ordered.
local last_ts, last_c = nil, nil
local clamped = now
if total > 0 then
  local tail = redis.call('LRANGE', LOG, -2, -1)
  if #tail == 2 then
    last_ts, last_c = tonumber(tail[1]), tonumber(tail[2])
    if last_ts > clamped then
      clamped = last_ts
    end
  else
    -- A state without its log cannot be trusted: start afresh.
    redis.call('DEL', KEYS[1], LOG)
    total = 0
  end
end

-- Drops events from the head of the log while should_drop(ts, cost) holds,
-- taking their cost off the total.
local function drop_head(should_drop)
  local drop = each_event(LOG, function(ts, c)
    if not should_drop(ts, c) then
      return true
    end
    total = total - c
    return false
  end)
  if drop > 0 then
    redis.call('LTRIM', LOG, drop, -1)
  end
end

-- Events leave the window at ts + w <= now. Every event in the log is at
-- or after born (the first event of this life): while born + w is after
-- now, none has left, and the head is not read (a redis.call, ~7,000
-- instructions). A born that is not a number reads the head.
local trimmed = false
if total > 0 and (born or 0) + w <= clamped then
  local head = tonumber(redis.call('LINDEX', LOG, 0))
  if head + w <= clamped then
    drop_head(function(ts, _)
      return ts + w <= clamped
    end)
    trimmed = true
    if total == 0 then
      last_ts, last_c = nil, nil
    end
  end
end

-- Records c units at the clamped now, then keeps only the newest events
-- holding at least `limit` units (a head costs at least 1, so nothing is
-- dropped unless total > limit; the newest event is never dropped).
local recorded = false
local function record(c)
  -- The total saturates at MAX_COUNT (the model's record).
  if c > MAX_COUNT - total then
    c = MAX_COUNT - total
  end
  if c <= 0 then
    return
  end
  if total == 0 then
    born = clamped
  end
  if last_ts == clamped then
    last_c = last_c + c
    redis.call('LSET', LOG, -1, fmt(last_c))
  else
    redis.call('RPUSH', LOG, fmt(clamped), fmt(c))
    last_ts, last_c = clamped, c
  end
  total = total + c
  recorded = true
  if total > limit then
    drop_head(function(ts, hc)
      if total - hc >= limit then
        if ts + w > trimmed_until then
          trimmed_until = ts + w
        end
        return true
      end
      return false
    end)
  end
end

-- A settle: the excess is recorded now, whatever the policy (at most
-- limit); else the unused units are taken out of the reservation's entry,
-- if it is still in the window and in this life. Answers '?1'.
local settling = op == 'settle'
if settling then
  local units, actual, m = cost, settle.actual, settle.marks[1]
  if actual > units then
    op, cost = 'overdraw', actual - units
  else
    op, cost = 'peek', 1
    -- Not while an event the log dropped is still in the window.
    if actual < units and m and m.born == born and total > 0 and trimmed_until <= now then
      local refund = refund_event(LOG, m.at, units - actual)
      if refund then
        total = total - refund
        -- The newest entry may be gone: now is clamped to the new one.
        last_ts, last_c = nil, nil
        clamped = now
        if total > 0 then
          local tail = redis.call('LRANGE', LOG, -2, -1)
          last_ts, last_c = tonumber(tail[1]), tonumber(tail[2])
          if last_ts > clamped then
            clamped = last_ts
          end
        end
      end
    end
  end
end

local want = cost
if op == 'penalise' or op == 'overdraw' then
  local units = cost
  if units > limit then
    units = limit
  end
  if units > 0 and (p.penalise or op == 'overdraw') then
    record(units)
  end
  want = 1
end

local verdict, retry = 0, 0
if want > limit then
  verdict = 2
else
  local fits = total + want <= limit
  if op == 'acquire' and (fits or p.penalise) then
    record(want)
  end
  if fits then
    verdict = 1
  else
    -- Retry-after: when the oldest events that block this request leave
    -- (inside the kept events: at most `limit` of them are read).
    -- total - limit first: total + want may pass 2^53, and round.
    local needed = (total - limit) + want
    local freed = 0
    retry = w
    each_event(LOG, function(ts, c)
      freed = freed + c
      if freed >= needed then
        retry = ts + w - clamped
        return true
      end
      return false
    end)
  end
end

local reset = 0
if last_ts then
  reset = last_ts + w - clamped
end
local remaining = 0
if limit > total then
  remaining = limit - total
end

if total == 0 then
  if trimmed or settling then
    redis.call('DEL', KEYS[1], LOG)
  end
elseif recorded or settling then
  -- A settle is a write either way: the expiry follows the state.
  local expires_at = last_ts + w
  if trimmed_until > 0 then
    -- t, kept while the HASH lives (absent: none dropped), in the same
    -- HSET: a redis.call costs ~7,000 instructions.
    redis.call('HSET', KEYS[1], 's', 'w', 'x', fmt(expires_at), 'n', fmt(total), 'b', fmt(born),
      't', fmt(trimmed_until))
  else
    redis.call('HSET', KEYS[1], 's', 'w', 'x', fmt(expires_at), 'n', fmt(total), 'b', fmt(born))
  end
  expire(KEYS[1], expires_at, now, LOG)
elseif trimmed then
  -- Not a write: the expiry stays as the last write set it.
  redis.call('HSET', KEYS[1], 'n', fmt(total))
end

if RESERVE and verdict == 1 then
  return { verdict, limit, remaining, retry, reset, w, born, last_ts, 0 }
end
return { verdict, limit, remaining, retry, reset, w }
