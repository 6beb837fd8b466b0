-- Frees a lock whoever holds it (an operator's forced release), keeping
-- its last fence, and announces it on the general release channel, which
-- every waiting process listens to.
-- KEYS[1] lock key, KEYS[2] owner hash, KEYS[3] waiting queue (one hash tag)
-- ARGV[1] release channel, ARGV[2] pub/sub mode ('s', 'c', 'a', 'n')
-- Returns the token that held the key, or '' when it was free.
local tok, f, flags = lock_parse(redis.call('GET', KEYS[1]))
if not tok then
  return ''
end
tombstone(KEYS[1], f, waiters_flag(KEYS[3]))
redis.call('DEL', KEYS[2])
local pub = publisher(ARGV[2])
if pub then
  redis.call(pub, ARGV[1], tok)
end
return tok
