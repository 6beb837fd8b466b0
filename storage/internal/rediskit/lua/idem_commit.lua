-- Completes an in-flight claim and applies an effect, in one script: both
-- happen, or neither. The effect is the caller's Lua, defined above this
-- file as effect(keys, argv) (see redisstore.NewEffectScript); it returns
-- nothing to go ahead, or a reason (a string) to refuse, and must check
-- before it writes: a refusal or an error after a write leaves that write.
-- KEYS[1] record, KEYS[2..] the effect's keys (the record's hash slot)
-- ARGV[1] token, ARGV[2] retention in milliseconds, ARGV[3] result,
-- ARGV[4] channel, ARGV[5] pub/sub mode, ARGV[6..] the effect's arguments
-- Returns {1, ''} done, {0, ''} not our claim (nothing run), {2, reason}
-- refused by the effect (nothing written); an error reply when the effect
-- raised an error or returned redis.error_reply (the record not written).
local rec = our_claim(KEYS[1], ARGV[1], false)
if not rec then
  return {0, ''}
end
local ekeys, eargv = {}, {}
for i = 2, #KEYS do ekeys[#ekeys + 1] = KEYS[i] end
for i = 6, #ARGV do eargv[#eargv + 1] = ARGV[i] end
local refused = effect(ekeys, eargv)
if type(refused) == 'table' and refused.err then
  return refused -- the effect's redis.error_reply: an error reply, not a refusal
end
if refused then
  return {2, tostring(refused)}
end
redis.call('SET', KEYS[1], record_value('c', rec.f, '', '', rec.fp, ARGV[3]), 'PX', ARGV[2])
if has(rec.fl, 'w') then
  local pub = publisher(ARGV[5])
  if pub then
    redis.call(pub, ARGV[4], 'complete')
  end
end
return {1, ''}
