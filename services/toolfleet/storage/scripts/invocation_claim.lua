-- Claim an invocation id for the first accepted request that names it.
--
-- KEYS[1]: the claim, a string holding the request's identity (tenant, agent, tool,
--          requested version, parameters hash) as the caller encodes it
-- ARGV[1]: this request's identity, ARGV[2]: TTL in seconds
-- The first claim sets the identity; a later request with the same identity renews
-- nothing and changes nothing (a redelivery or a retry of the same call).
-- Returns 'new' (this request fixed the id), 'same' (the id is this call's already)
-- or 'conflict' (the id is another call's).
local first = redis.call('GET', KEYS[1])
if not first then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  return 'new'
end
if first == ARGV[1] then
  return 'same'
end
return 'conflict'
