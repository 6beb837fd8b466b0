-- Reports a lock's state, for operators. Read-only.
-- KEYS[1] lock key, KEYS[2] owner hash, KEYS[3] waiting queue (one hash tag)
-- Returns {token or '', pttl, the key's last fence, owner or '', holds,
-- owner's fence or '0', queue length}. The owner fields count only while
-- the owner hash's token is the key's.
local tok, f, flags = lock_parse(redis.call('GET', KEYS[1]))
local pttl = -2
if tok then
  pttl = redis.call('PTTL', KEYS[1])
else
  tok = ''
end
local owner, holds, ofence = '', 0, '0'
if tok ~= '' and has(flags, 'o') then
  local o = redis.call('HMGET', KEYS[2], 'o', 't', 'n', 'f')
  if o[2] == tok then
    owner, holds, ofence = o[1] or '', tonumber(o[3]) or 0, o[4] or '0'
  end
end
return {tok, pttl, fmt(f), owner, holds, ofence, redis.call('ZCARD', KEYS[3])}
