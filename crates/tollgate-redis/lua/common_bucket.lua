-- tollgate: token-bucket helpers, shared by token_bucket_ops.lua and
-- composite.lua: each follows common.lua (src/scripts.rs) and runs with
-- its locals. Apart from common.lua because every local function of a
-- script is built on every call (~450 instructions each): a script
-- includes only the helpers it calls.

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
    -- An unnamed life (born 0) has no reservation: no mark names it (a
    -- release before lives were named by their first reservation marked
    -- some 0; TokenBucketState::settle).
    if m and born ~= 0 and m.born == born and tat > now then
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
          -- A new life (unnamed until its first reservation): what is
          -- outstanding refunds nothing.
          born, refunds = 0, { n = 0 }
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
      born, refunds = 0, { n = 0 }
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
