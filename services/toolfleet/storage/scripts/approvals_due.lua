-- Claim the pending approvals whose expiry is due, so exactly one sweeper ends each.
--
-- KEYS[1]: the index (sorted set, member = {<tenant_id>}:<invocation_id>,
--          score = expires_at epoch s)
-- ARGV[1]: now (epoch s), ARGV[2]: most entries to claim, ARGV[3]: lease in seconds,
-- ARGV[4]: prefix of pending keys, ARGV[5]: prefix of expiring (claimed) keys
-- A claimed entry's data moves to its expiring key (so a late human decision no longer
-- finds it) and its score moves to now + lease: a sweeper that dies before ``ack``
-- leaves it to be claimed again once the lease runs out.
-- Returns the claimed entries' JSON.
local now = tonumber(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local claimed = {}
for _, id in ipairs(due) do
  local pending = ARGV[4] .. id
  local expiring = ARGV[5] .. id
  local data = redis.call('GET', pending)
  if data then
    redis.call('RENAME', pending, expiring)
  else
    data = redis.call('GET', expiring)
  end
  if data then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), id)
    table.insert(claimed, data)
  else
    redis.call('ZREM', KEYS[1], id) -- its data is gone (grace period over): drop it
  end
end
return claimed
