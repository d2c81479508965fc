-- tollgate: helpers for sliding-window logs, shared by sliding_window.lua
-- and composite.lua: each follows common.lua (src/scripts.rs) and runs
-- with its locals. Apart from common.lua because every local function of
-- a script is built on every call (~450 instructions each): a script
-- includes only the helpers it calls.

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
