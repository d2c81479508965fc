-- tollgate: replace an override only if it is still the one the caller
-- read (Backend::replace_override, a compare-and-set).
--
-- KEYS[1]: the override's key (a key's `…:override`, or a limiter's).
-- ARGV[1]: '1' if the caller read an override, '0' if it read none.
-- ARGV[2]: the override it read, encoded as stored ('' with ARGV[1] '0').
-- ARGV[3]: the new override, encoded.
-- ARGV[4]: its TTL in milliseconds (at least 1).
-- Answers 1 when the new override was written, else nothing is written:
-- 0 when none is stored (cleared or expired since) or one is stored where
-- none was read; the stored value when it is not the one read, byte for
-- byte. tollgate writes one encoding per policy (encoding.rs, version 1),
-- but decode reads others (version 2, a number written with a leading
-- zero): the caller decodes the value, and if it is the policy it read,
-- compares again with this spelling.

local stored = redis.call('GET', KEYS[1])
if ARGV[1] == '1' then
  if not stored then
    return 0
  end
  if stored ~= ARGV[2] then
    return stored
  end
elseif stored then
  return 0
end
redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
return 1
