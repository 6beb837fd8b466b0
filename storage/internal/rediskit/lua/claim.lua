-- Prepended to the scripts that read or write an idempotency record (see
-- scripts.go), after fence.lua.
--
-- A record is one string:
--   "R1|<state>|<fence>|<flags>|<token>|<fingerprint length>|<fingerprint><result>"
-- state 'i' in flight (token: the claim's), 'c' completed (token empty,
-- result: the stored result), 'x' abandoned (a tombstone: free, keeping
-- the last fence for tomb_life milliseconds); flags: 'w' a duplicate waits
-- for the claim (its completion or abandonment is announced only then).
-- Its PTTL is the claim's lease or the retention. The fence lives in the
-- record: a new key costs one write to claim and one to complete.
local function record_parse(v)
  local s, f, fl, t, n, p = string.match(v, '^R1|(%a)|(%d+)|(%a*)|([^|]*)|(%d+)|()')
  if not s then
    return nil
  end
  n = tonumber(n)
  local fp = string.sub(v, p, p + n - 1)
  if #fp ~= n then
    return nil
  end
  return {s = s, f = tonumber(f), fl = fl, t = t, fp = fp, r = string.sub(v, p + n)}
end
local function record_value(s, f, fl, t, fp, r)
  return 'R1|' .. s .. '|' .. fmt(f) .. '|' .. fl .. '|' .. t .. '|' .. fmt(#fp) .. '|' .. fp .. r
end
-- record_read returns a record's value, false when there is none, or an
-- error reply table when something else lives under its name.
local function record_read(key)
  return redis.pcall('GET', key)
end
-- our_claim returns the record of key if it is the in-flight claim of
-- token, else nil.
local function our_claim(key, token)
  local v = record_read(key)
  if type(v) ~= 'string' then
    return nil
  end
  local r = record_parse(v)
  if r and r.s == 'i' and r.t == token then
    return r
  end
  return nil
end
