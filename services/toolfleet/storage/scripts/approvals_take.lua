-- Take a pending approval (a human decision or a cancellation): one decision wins.
--
-- KEYS[1]: the pending key, KEYS[2]: the expiry index; ARGV[1]: the call's index member
-- ({<tenant_id>}:<invocation_id>)
-- The index entry goes only with the data: an approval a sweeper has claimed (moved to
-- its expiring key) keeps its entry, so it is claimed again if that sweeper dies.
-- Returns the approval's JSON, or nil.
local data = redis.call('GETDEL', KEYS[1])
if data then
  redis.call('ZREM', KEYS[2], ARGV[1])
end
return data
