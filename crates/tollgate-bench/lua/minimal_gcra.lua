-- The smallest correct token bucket (GCRA): the load tool's baseline, what
-- a careful hand-written client sends. Not tollgate's script: no overrides,
-- no cost, no peek, no strategies; one string key holding the theoretical
-- arrival time (TAT), written with its expiry in the same SET.
--
-- KEYS[1]  the key's state: STRING, the TAT in µs since the epoch
-- ARGV[1]  emission interval in µs (period / refill), at least 1
-- ARGV[2]  burst tolerance in µs: capacity * interval
--
-- Returns {1, remaining} when admitted, {0, retry_after_us} when refused
-- (a refusal writes nothing). The key expires when the bucket is full
-- again, when its state equals a fresh key's. Numbers are exact in a Lua
-- double up to 2^53 µs (year 2255); '%d' keeps them from tostring's 1e+15.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local interval, tau = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = math.max(tonumber(redis.call('GET', KEYS[1])) or now, now)
local debt = tat + interval - now
if debt > tau then
  return { 0, debt - tau }
end
redis.call('SET', KEYS[1], string.format('%d', tat + interval), 'PX', math.ceil(debt / 1000))
return { 1, math.floor((tau - debt) / interval) }
