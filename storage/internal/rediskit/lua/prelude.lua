-- Prepended to the scripts that announce on pub/sub (see redislua.go).
-- publisher returns the command for a pub/sub mode: 's' sharded
-- (SPUBLISH), 'c' classic (PUBLISH), 'a' by the server's version (sharded
-- from Redis 7.0), or nil for 'n' (announce nothing).
local function publisher(mode)
  if mode == 'a' then
    local v = redis.REDIS_VERSION_NUM
    if v and v >= 0x070000 then mode = 's' else mode = 'c' end
  end
  if mode == 's' then return 'SPUBLISH' elseif mode == 'c' then return 'PUBLISH' end
  return nil
end

