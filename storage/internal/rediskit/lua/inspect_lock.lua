-- Reports a lock's state, for operators. Read-only.
-- KEYS[1] lock key, KEYS[2] fence counter, KEYS[3] owner hash,
-- KEYS[4] waiting queue (one hash tag)
-- Returns {token or '', pttl, fence counter or '0' (see fence.lua: "f" or
-- "f:reserved"), owner or '', holds,
-- owner's fence or '0', queue length}. The owner fields count only while
-- the owner hash's token is the key's.
local tok = redis.call('GET', KEYS[1])
if not tok then
  tok = ''
end
local pttl = redis.call('PTTL', KEYS[1])
local fence = redis.call('GET', KEYS[2]) or '0'
local owner, holds, ofence = '', 0, '0'
if tok ~= '' then
  local o = redis.call('HMGET', KEYS[3], 'o', 't', 'n', 'f')
  if o[2] == tok then
    owner, holds, ofence = o[1] or '', tonumber(o[3]) or 0, o[4] or '0'
  end
end
return {tok, pttl, fence, owner, holds, ofence, redis.call('ZCARD', KEYS[4])}
