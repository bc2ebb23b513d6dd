-- Mark events processed: every key in KEYS set to 1 with a TTL of ARGV[1] seconds.
-- One call for the records of a whole fetch (or of one turn of the event loop): one
-- command to pack and parse instead of a SET each. Returns how many were marked.
for _, key in ipairs(KEYS) do
  redis.call('SET', key, '1', 'EX', ARGV[1])
end
return #KEYS
