-- Reports an idempotency record, for operators. Read-only.
-- KEYS[1] record (see idem_begin.lua)
-- Returns {'none'}, {'other', type}, or
-- {'hash', pttl, v, s, fp, t, f, r} with '' for missing fields.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return {'none'}
end
if kind ~= 'hash' then
  return {'other', kind}
end
local r = redis.call('HMGET', KEYS[1], 'v', 's', 'fp', 't', 'f', 'r')
for i = 1, 6 do
  if not r[i] then r[i] = '' end
end
return {'hash', redis.call('PTTL', KEYS[1]), r[1], r[2], r[3], r[4], r[5], r[6]}
