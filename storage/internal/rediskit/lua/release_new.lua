-- A release by a token whose key carries no flags (no owner's holds, no
-- process queued): release_fast.lua with KEYS[1] the lock key and ARGV[1]
-- token, ARGV[2] the fence floor, ARGV[3] the clock reading (release.lua's
-- first three) and ARGV[4] the highest fence the token handed out ('0':
-- not known), then this. It is release.lua's common case sent with one
-- key and three arguments instead of four and seven. It returns
-- release.lua's 0 (not ours) and 1 (let go), or -2 when the key carries
-- flags and only release.lua can decide.
return -2
