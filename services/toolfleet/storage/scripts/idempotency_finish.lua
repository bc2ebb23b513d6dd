-- Record an owner's outcome and/or hand over its waiters, atomically.
--
-- KEYS[1]: owner marker, KEYS[2]: outcome, KEYS[3]: waiters list (all of one call:
--          one tenant's invocation, in the tenant's slot)
-- ARGV[1]: the outcome JSON, ARGV[2]: '1' to store it, ARGV[3]: '1' to take the waiters
-- Returns {stored (1 or 0), waiter JSON...}; an invocation that owns no key (no live
-- owner marker) stores nothing.
local stored = 0
if ARGV[2] == '1' then
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then
    redis.call('SET', KEYS[2], ARGV[1], 'PX', ttl)
    stored = 1
  end
end
local reply = {stored}
if ARGV[3] == '1' then
  for _, waiter in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
    table.insert(reply, waiter)
  end
  redis.call('DEL', KEYS[3])
end
return reply
