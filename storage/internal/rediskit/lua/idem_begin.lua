-- Claims an idempotency key, or reports its record (see claim.lua).
-- KEYS[1] record
-- ARGV[1] fingerprint, ARGV[2] token, ARGV[3] lease in milliseconds,
-- ARGV[4] '1' when the caller waits for replicas (a replay then writes:
-- see replay_pttl in idem_begin_fast.lua)
-- Returns {1, fence, clock, attempt} claimed (clock: the server's clock in
-- µs when the fence was issued, for Redlock's check of its nodes; attempt:
-- idem.Claim.Attempt, 1 when absent); {2, lease left in ms} in flight; {3, pttl, result} completed; {4, pttl} another fingerprint;
-- {-2, reason} not our record; {-3, layout} a record of a layout this
-- version does not read (never taken over).
local f = clock_us()
local prev = fast_prev -- what idem_begin_fast.lua found (Redis 7.0+)
local px = fmt(tonumber(ARGV[3]) + attempt_memory)
if prev == nil then
  prev = record_read(KEYS[1])
  if prev == false then
    redis.call('SET', KEYS[1], record_value('i', f, '', ARGV[2], ARGV[1], ''), 'PX', px)
    return {1, f, f, 1}
  end
end
if type(prev) ~= 'string' then
  return {-2, 'a ' .. redis.call('TYPE', KEYS[1])['ok'] .. ', not a record'}
end
local r = record_parse(prev)
if not r then
  local layout = record_layout(prev)
  if layout then
    return {-3, layout}
  end
  return {-2, 'not a record: ' .. string.format('%q', string.sub(prev, 1, 40))}
end
local pttl = redis.call('PTTL', KEYS[1])
if r.s == 'x' or (r.s == 'i' and pttl <= attempt_memory) then
  -- Free: abandoned, or a claim whose lease ran out. The new claim is the
  -- next attempt.
  local n = attempt_of(r) + 1
  f = next_fence(r.f)
  redis.call('SET', KEYS[1], record_value('i', f, '', ARGV[2], ARGV[1], attempt_str(n)), 'PX', px)
  return {1, f, clock_us(), n}
end
if r.s == 'i' then
  pttl = pttl - attempt_memory
end
if r.fp ~= ARGV[1] then
  return {4, pttl}
end
if r.s == 'i' then
  return {2, pttl}
end
if r.s == 'c' then
  return {3, replay_pttl(), r.r}
end
return {-2, 'record state ' .. r.s}
