-- Prepended to the scripts that read or write an idempotency record (see
-- scripts.go), after fence.lua.
--
-- A record is one string, of layout R2 (oncekit v0.1.0's):
--   "R2|<state>|<fence>|<flags>|<token>|<fingerprint length>|<fingerprint><result>"
-- A value "R<n>|…" of another layout (an earlier or a later version's) is
-- never judged nor taken over: Begin answers that it cannot read it
-- (record_layout), and no other script treats it as a claim of its own.
-- state 'i' in flight (token: the claim's), 'c' completed (token empty,
-- result: the stored result), 'x' abandoned (a tombstone: free, keeping
-- the last fence for tomb_life milliseconds); flags: 'w' a duplicate waits
-- for the claim (its completion or abandonment is announced only then).
-- Its PTTL is the retention of a completed record; an in-flight record's
-- is its lease plus attempt_memory, and a tombstone's attempt_memory (or
-- less: see idem_finish.lua's giveback): after an in-flight claim's lease
-- ran out, its record stays as the memory of a claim that ended without
-- completing. An in-flight record and a tombstone keep, as their result,
-- their claim's attempt number (idem.Claim.Attempt; '' for 1), so that the
-- next claim's is one more. The fence lives in the record: a new key costs
-- one write to claim and one to complete.
local function record_parse(v)
  local s, f, fl, t, n, p = string.match(v, '^R2|(%a)|(%d+)|(%a*)|([^|]*)|(%d+)|()')
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
-- How long a record remembers a claim that ended without completing, in
-- ms (idem.AttemptMemory; the fast paths have the number written out).
local attempt_memory = 86400000
-- attempt_of is the attempt number an in-flight record or a tombstone
-- keeps ('' is 1; a given-back first claim's tombstone keeps '0');
-- attempt_str writes one.
local function attempt_of(r)
  return tonumber(r.r) or 1
end
local function attempt_str(n)
  if n <= 1 then
    return ''
  end
  return string.format('%d', n)
end
local function record_value(s, f, fl, t, fp, r)
  return 'R2|' .. s .. '|' .. fmt(f) .. '|' .. fl .. '|' .. t .. '|' .. fmt(#fp) .. '|' .. fp .. r
end
-- record_layout is the layout tag ("R1", "R3", …) of a value that is a
-- record of a layout this version does not read, else nil.
local function record_layout(v)
  local tag = string.match(v, '^(R%d+)|')
  if tag and tag ~= 'R2' then
    return tag
  end
  return nil
end
-- record_read returns a record's value, false when there is none, or an
-- error reply table when something else lives under its name.
local function record_read(key)
  return redis.pcall('GET', key)
end
-- our_claim returns the record of key if it is the in-flight claim of
-- token, else nil. A claim whose lease ran out is still the token's while
-- no Begin took it over (no other run can have started), unless strict
-- (Redlock: see rediskit.Base.StrictLeases).
local function our_claim(key, token, strict)
  local v = record_read(key)
  if type(v) ~= 'string' then
    return nil
  end
  local r = record_parse(v)
  if r and r.s == 'i' and r.t == token and (not strict or redis.call('PTTL', key) > attempt_memory) then
    return r
  end
  return nil
end
