-- Prepended to the scripts that act on an in-flight idempotency claim (see
-- scripts.go). our_claim reports whether record holds the claim of token:
-- a version-1 record hash, in flight, with that token.
-- (pcall: a key of another type answers WRONGTYPE, which is not ours
-- either; one call where TYPE and HMGET were two.)
local function our_claim(record, token)
  local r = redis.pcall('HMGET', record, 'v', 's', 't')
  if r.err then
    return false
  end
  return r[1] == '1' and r[2] == 'i' and r[3] == token
end

