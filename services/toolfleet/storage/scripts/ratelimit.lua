-- Token buckets: take one token from every bucket in KEYS, or from none.
-- Mirrors toolfleet.policy.ratelimit.acquire_all (the reference model).
--
-- KEYS: the buckets (hashes {tokens, ts}); a missing bucket is a full one.
-- ARGV[1]: the time in seconds, or '' for the Redis server's clock (TIME).
-- ARGV[2 + 3(i-1) ..]: capacity, refill rate per second, idle TTL in seconds of KEYS[i].
-- Returns {1, ''} when allowed, {0, retry_after_s} when refused (a string: Lua numbers
-- returned to Redis are truncated to integers).
if redis.replicate_commands then
  redis.replicate_commands() -- Redis < 5: allow writes after TIME; a no-op since 5
end

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
else
  now = tonumber(ARGV[1])
end

local levels = {}
local wait = 0
for i, key in ipairs(KEYS) do
  local base = 2 + 3 * (i - 1)
  local capacity = tonumber(ARGV[base])
  local rate = tonumber(ARGV[base + 1])
  local state = redis.call('HMGET', key, 'tokens', 'ts')
  local level = capacity
  if state[1] and state[2] then
    local elapsed = math.max(0, now - tonumber(state[2]))
    level = math.min(capacity, tonumber(state[1]) + elapsed * rate)
  end
  levels[i] = level
  if level < 1 then
    wait = math.max(wait, (1 - level) / rate)
  end
end

if wait > 0 then
  return {0, string.format('%.17g', wait)}
end

for i, key in ipairs(KEYS) do
  local ttl = tonumber(ARGV[2 + 3 * (i - 1) + 2])
  redis.call('HSET', key, 'tokens', string.format('%.17g', levels[i] - 1),
             'ts', string.format('%.17g', now))
  redis.call('EXPIRE', key, ttl)
end
return {1, ''}
