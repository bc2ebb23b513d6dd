-- Queue a duplicate behind the first invocation, unless the first already finished.
--
-- KEYS[1]: owner marker, KEYS[2]: outcome, KEYS[3]: waiters list (of the first invocation)
-- ARGV[1]: the waiter JSON
-- Returns {'finished', outcome} | {'queued'} | {'unknown'} (no live claim: nothing to wait on)
local outcome = redis.call('GET', KEYS[2])
if outcome then
  return {'finished', outcome}
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then
  return {'unknown'}
end
redis.call('RPUSH', KEYS[3], ARGV[1])
redis.call('PEXPIRE', KEYS[3], ttl)
return {'queued'}
