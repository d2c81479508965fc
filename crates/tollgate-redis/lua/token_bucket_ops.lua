-- tollgate: token bucket, everything but token_bucket.lua's acquire path:
-- peek, penalise (records nothing: a peek of 1), reset, reserve, settle, a
-- policy in force of another strategy, an unusual encoding. Runs after
-- token_bucket.lua and common.lua (src/scripts.rs), with their locals:
-- now, enc, tat, born, present, store, gcra.

local p = decode(enc)
if p.kind ~= 't' then
  return { -1, p.kind }
end
local op, cost, settle = parse_op()
if op == 'reset' then
  tat, born = 0, 0
end
if present and tat == 0 then
  -- Expired, of another strategy, or reset: the key is fresh.
  redis.call('DEL', KEYS[1])
  present = false
end
if op == 'reset' or op == 'penalise' then
  op, cost = 'peek', 1
end
if op == 'settle' then
  tat, born = bucket_settle(p, tat, born, now, cost, settle.actual, settle.marks[1])
  if tat > now then
    store(tat, born)
  elseif present then
    redis.call('DEL', KEYS[1])
  end
  op, cost = 'peek', 1
end
return gcra(p.capacity, p.interval, tat, born, cost, op == 'acquire', RESERVE, false)
