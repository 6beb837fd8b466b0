-- Reports an idempotency record, for operators. Read-only.
-- KEYS[1] record (see claim.lua)
-- Returns {'none'} (also for an abandoned record's tombstone),
-- {'other', type}, {'corrupt', pttl, the value's start}, or
-- {'record', pttl, state, fingerprint, token, fence, result}.
local v = record_read(KEYS[1])
if v == false then
  return {'none'}
end
if type(v) ~= 'string' then
  return {'other', redis.call('TYPE', KEYS[1])['ok']}
end
local r = record_parse(v)
if not r then
  return {'corrupt', redis.call('PTTL', KEYS[1]), string.sub(v, 1, 40)}
end
if r.s == 'x' then
  return {'none'}
end
return {'record', redis.call('PTTL', KEYS[1]), r.s, r.fp, r.t, fmt(r.f), r.r}
