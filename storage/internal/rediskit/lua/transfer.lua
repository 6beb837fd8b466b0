-- Hands a held lock from one lease of this process to the next local
-- waiter without letting go of the key: one round trip instead of a
-- release and an acquire.
-- KEYS[1] lock key, KEYS[2] owner hash (one hash tag)
-- ARGV[1] current token, ARGV[2] next token, ARGV[3] ttl in milliseconds,
-- ARGV[4] the next waiter's owner, or ""
-- Returns {1, fence, n} when handed off (the fences fence .. fence + n − 1
-- of a new hold: see issue in fence.lua); {2, 0}
-- when the current token is an owner's with other holds left (one hold
-- given back, nothing handed over); {0, 0} when the current token no
-- longer holds the key.
local tok, f, flags = lock_parse(redis.call('GET', KEYS[1]))
if tok ~= ARGV[1] then
  return {0, 0}
end
if has(flags, 'o') and redis.call('HGET', KEYS[2], 't') == ARGV[1] then
  if redis.call('HINCRBY', KEYS[2], 'n', -1) > 0 then
    return {2, 0}
  end
  redis.call('DEL', KEYS[2])
end
local nf, last = issue(f)
local fl = ''
if has(flags, 'w') then
  fl = 'w'
end
if ARGV[4] ~= '' then
  fl = fl .. 'o'
  redis.call('HSET', KEYS[2], 'o', ARGV[4], 't', ARGV[2], 'n', 1, 'f', fmt(nf))
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
redis.call('SET', KEYS[1], lock_value(ARGV[2], last, fl), 'PX', ARGV[3])
return {1, nf, last - nf + 1}
