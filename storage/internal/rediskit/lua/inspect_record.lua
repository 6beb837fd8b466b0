-- Reports an idempotency record, for operators. Read-only.
-- KEYS[1] record (see claim.lua)
-- Returns {'none'} (also for an abandoned record's tombstone, and an
-- in-flight claim past its lease),
-- {'other', type}, {'corrupt', pttl, the value's start}, {'layout', pttl,
-- the layout tag} (a layout this version does not read), or
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
  local layout = record_layout(v)
  if layout then
    return {'layout', redis.call('PTTL', KEYS[1]), layout}
  end
  return {'corrupt', redis.call('PTTL', KEYS[1]), string.sub(v, 1, 40)}
end
local pttl = redis.call('PTTL', KEYS[1])
if r.s == 'i' then
  pttl = pttl - attempt_memory -- the lease left (see claim.lua)
end
if r.s == 'x' or (r.s == 'i' and pttl <= 0) then
  return {'none'}
end
local res = r.r
if r.s == 'i' then
  res = ''
end
return {'record', pttl, r.s, r.fp, r.t, fmt(r.f), res}
