-- tollgate: exact integer helpers, the first lines of every script (see
-- src/scripts.rs; each function here is a closure built on every call, so
-- only what the token bucket's acquire path needs is here; fmt is in
-- common.lua). Integers stay below 2^53 (exact in a Lua double) and are
-- written with string.format('%d'), never tostring (which would write
-- 1e+15).

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
-- the script would, and at least ARGV[4] (the tests' floor; see common.lua).
local function ttl_ms(expires_at, now)
  local ms = math.floor((expires_at - now + 999) / 1000)
  if ARGV[4] and ms < tonumber(ARGV[4]) then
    ms = tonumber(ARGV[4])
  end
  return string.format('%d', ms)
end

