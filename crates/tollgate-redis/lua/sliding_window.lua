-- tollgate: exact sliding window (a log of events), one decision.
--
-- KEYS and ARGV: see common.lua.
-- State, KEYS[1]: HASH { s = 'w', x = expiry, n = total cost in the log }.
-- Log, KEYS[2]: LIST of pairs, oldest first: ts1, cost1, ts2, cost2, ...
-- (timestamps non-decreasing; events at one instant are merged). Both keys
-- share the hash tag and the TTL.
-- Model: SlidingWindowState::acquire.

local CHUNK = 256 -- list items (128 events) read per LRANGE

local now = now_us()
local p = policy_in_force()
if p.kind ~= 'w' then
  return { -1, p.kind }
end
local cost = tonumber(ARGV[2])
local w, limit = p.window, p.limit

local st = redis.call('HMGET', KEYS[1], 's', 'x', 'n')
local live = st[1] == 'w' and tonumber(st[2]) > now and cost >= 0
local total = 0
if live then
  total = tonumber(st[3])
else
  -- Fresh: drop an expired log, another strategy's state, or (reset) ours.
  redis.call('DEL', KEYS[1], KEYS[2])
end
if cost < 0 then
  cost = 0
end

-- The newest event; now is clamped to it so the log stays ordered.
local last_ts, last_c = nil, nil
local clamped = now
if total > 0 then
  local tail = redis.call('LRANGE', KEYS[2], -2, -1)
  if #tail == 2 then
    last_ts, last_c = tonumber(tail[1]), tonumber(tail[2])
    if last_ts > clamped then
      clamped = last_ts
    end
  else
    -- A state without its log cannot be trusted: start afresh.
    redis.call('DEL', KEYS[1], KEYS[2])
    total = 0
  end
end

-- Events leave the window at ts + w <= now.
local trimmed = false
if total > 0 then
  local head = tonumber(redis.call('LINDEX', KEYS[2], 0))
  if head + w <= clamped then
    local drop, done = 0, false
    while not done do
      local chunk = redis.call('LRANGE', KEYS[2], drop, drop + CHUNK - 1)
      if #chunk == 0 then
        break
      end
      for i = 1, #chunk, 2 do
        if tonumber(chunk[i]) + w > clamped then
          done = true
          break
        end
        total = total - tonumber(chunk[i + 1])
        drop = drop + 2
      end
    end
    redis.call('LTRIM', KEYS[2], drop, -1)
    trimmed = true
    if total == 0 then
      last_ts, last_c = nil, nil
    end
  end
end

local want = cost
if want < 1 then
  want = 1
end
local fits = total + want <= limit
local recorded = false
if cost > 0 and (fits or p.penalise) then
  if last_ts == clamped then
    last_c = last_c + cost
    redis.call('LSET', KEYS[2], -1, fmt(last_c))
  else
    redis.call('RPUSH', KEYS[2], fmt(clamped), fmt(cost))
    last_ts, last_c = clamped, cost
  end
  total = total + cost
  recorded = true
end

-- Retry-after: when the oldest events that block this request leave.
local retry = 0
if not fits then
  local needed = total + want - limit
  retry = w
  local freed, idx, done = 0, 0, false
  while not done do
    local chunk = redis.call('LRANGE', KEYS[2], idx, idx + CHUNK - 1)
    if #chunk == 0 then
      break
    end
    for i = 1, #chunk, 2 do
      freed = freed + tonumber(chunk[i + 1])
      if freed >= needed then
        retry = tonumber(chunk[i]) + w - clamped
        done = true
        break
      end
    end
    idx = idx + CHUNK
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
  if trimmed then
    redis.call('DEL', KEYS[1], KEYS[2])
  end
elseif recorded then
  local expires_at = last_ts + w
  redis.call('HSET', KEYS[1], 's', 'w', 'x', fmt(expires_at), 'n', fmt(total))
  expire(KEYS[1], expires_at, now)
  expire(KEYS[2], expires_at, now)
elseif trimmed then
  -- Not a write: the expiry stays as the last write set it.
  redis.call('HSET', KEYS[1], 'n', fmt(total))
end

local allowed = 0
if fits then
  allowed = 1
end
return { allowed, limit, remaining, retry, reset }
