-- Prepended to the scripts that act on an in-flight idempotency claim (see
-- scripts.go). our_claim reports whether record holds the claim of token:
-- a version-1 record hash, in flight, with that token.
local function our_claim(record, token)
  if redis.call('TYPE', record)['ok'] ~= 'hash' then
    return false
  end
  local r = redis.call('HMGET', record, 'v', 's', 't')
  return r[1] == '1' and r[2] == 'i' and r[3] == token
end

