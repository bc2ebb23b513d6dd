-- Claim an idempotency key for an invocation, or report who owns it.
--
-- KEYS[1]: the claim of one tenant's key, a hash {invocation_id, request_hash}
-- KEYS[2]: the owner marker of the claiming call (same tenant, same hash tag)
-- ARGV[1]: invocation id, ARGV[2]: request hash, ARGV[3]: TTL in seconds,
-- ARGV[4]: prefix of the tenant's outcome keys (outcome key = prefix .. first invocation
--          id: a call of the same tenant, in the same Redis Cluster slot)
-- Returns {'new', id} | {'duplicate', first_id, outcome or false} | {'conflict', first_id}
local owner = redis.call('HMGET', KEYS[1], 'invocation_id', 'request_hash')
if not owner[1] or owner[1] == ARGV[1] then
  -- Unclaimed, or the owner again (a redelivery): it owns the key.
  redis.call('HSET', KEYS[1], 'invocation_id', ARGV[1], 'request_hash', ARGV[2])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  redis.call('SET', KEYS[2], '1', 'EX', ARGV[3])
  return {'new', ARGV[1]}
end
if owner[2] ~= ARGV[2] then
  return {'conflict', owner[1]}
end
return {'duplicate', owner[1], redis.call('GET', ARGV[4] .. owner[1])}
