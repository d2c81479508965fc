-- tollgate: replace an override only if it is still the one the caller
-- read (Backend::replace_override, a compare-and-set).
--
-- KEYS[1]: the override's key (a key's `…:override`, or a limiter's).
-- ARGV[1]: '1' if the caller read an override, '0' if it read none.
-- ARGV[2]: the override it read, encoded as stored ('' with ARGV[1] '0').
-- ARGV[3]: the new override, encoded.
-- ARGV[4]: its TTL in milliseconds (at least 1).
-- Answers 1 when the new override was written, 0 when the stored one is
-- not the one read (changed, cleared or expired since): nothing written.
-- Compared as stored, byte for byte: tollgate writes one encoding per
-- policy (encoding.rs, version 1).

local stored = redis.call('GET', KEYS[1])
if ARGV[1] == '1' then
  if stored ~= ARGV[2] then
    return 0
  end
elseif stored then
  return 0
end
redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
return 1
