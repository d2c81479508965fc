-- The smallest correct token bucket (GCRA): the load tool's baseline, what
-- a careful hand-written client sends. Not tollgate's script: no overrides,
-- no cost, no peek, no strategies; one string key holding the theoretical
-- arrival time (TAT), written with its expiry in the same SET.
--
-- KEYS[1]  the key's state: STRING, the TAT in µs since the epoch
-- ARGV[1]  emission interval in µs (period / refill), at least 1
-- ARGV[2]  burst tolerance in µs: capacity * interval
--
-- Returns one integer: the tokens remaining (>= 0) when admitted, minus the
-- retry-after in µs (< 0) when refused; a refusal writes nothing. The key
-- expires when the bucket is full again, when its state equals a fresh
-- key's. Numbers are exact in a Lua double up to 2^53 µs (year 2255); '%d'
-- keeps them from tostring's 1e+15.
--
-- It gets the server-side economies tollgate's token_bucket.lua takes (see
-- its comments): one integer reply, not a table (~5,000 instructions a
-- decision less, callgrind), and arguments made numbers by arithmetic, not
-- tonumber; the stored TAT is read with tonumber, as tollgate reads its own.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local interval, tau = ARGV[1] + 0, ARGV[2] + 0
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then
  tat = now
end
local debt = tat + interval - now
if debt > tau then
  return tau - debt
end
redis.call('SET', KEYS[1], string.format('%d', tat + interval), 'PX', math.floor((debt + 999) / 1000))
return math.floor((tau - debt) / interval)
