-- stock: apply a batch of operations to one item (package stock, the rules
-- of stockdriver.Apply), by the server's clock, atomically.
-- KEYS[1] the item's hash (v = 'S1', put, free, held, sold), KEYS[2] its
-- holds (a sorted set of keys by deadline, ms), KEYS[3..] the record of
-- each operation that names a key, in order.
-- ARGV[1] the records' name prefix (the record of key k is ARGV[1]..k),
-- then four per operation: kind (t take, h hold, c confirm, r release,
-- a add, s set), units, ttl ms, keep ms (decimal integers); an operation's
-- key is its record's name past the prefix.
-- A record is 'S1|<made by: t|h>|<state>|<units>|<deadline ms>|<keep ms>',
-- state s sold, h held, o sold out, r released, x expired; its PTTL is its
-- memory: none while held (the hold's end must find it), keep ms from the
-- take or from the hold's end.
-- Returns {exists, put, free, held, sold, expired, then per operation:
-- state (n none/done, s, h, o, r, x, i no item, m mismatch), units,
-- remaining ms, replayed}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HMGET', KEYS[1], 'v', 'put', 'free', 'held', 'sold')
local exists = h[1] ~= false
if exists and h[1] ~= 'S1' then
	return redis.error_reply('ONCEKIT_LAYOUT stock item ' .. KEYS[1])
end
local put, free, held, sold = tonumber(h[2]) or 0, tonumber(h[3]) or 0, tonumber(h[4]) or 0, tonumber(h[5]) or 0
-- Every record is read, and checked, before anything is written: a record
-- of a layout this version does not know fails the whole call unchanged.
local recs = {}
local bad = nil
-- parse reads one record's value (false: none) into recs.
local function parse(rk, v)
	if not v then
		recs[rk] = false
		return
	end
	local kind, st, units, dl, keep = string.match(v, '^S1|([th])|([shorx])|(%d+)|(%d+)|(%d+)$')
	if not kind then
		bad = rk
		return
	end
	recs[rk] = { kind = kind, st = st, units = tonumber(units), dl = tonumber(dl), keep = tonumber(keep) }
end
local function get(rk)
	local r = recs[rk]
	if r == nil then
		parse(rk, redis.call('GET', rk))
		r = recs[rk]
	elseif type(r) == 'string' then -- written by this call, read again
		parse(rk, r)
		r = recs[rk]
	end
	return r or nil
end
local function set(rk, r, ...)
	recs[rk] = r
	redis.call('SET', rk, string.format('S1|%s|%s|%d|%d|%d', r.kind, r.st, r.units, r.dl, r.keep), ...)
end

-- The records the call names, and those of holds now due, in one read
-- (MGET, in slices the Lua stack takes).
local due = {}
local names = {}
if exists then
	due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 256)
	for _, k in ipairs(due) do names[#names + 1] = ARGV[1] .. k end
end
for i = 3, #KEYS do names[#names + 1] = KEYS[i] end
for from = 1, #names, 1000 do
	local to = math.min(from + 999, #names)
	local vals = redis.call('MGET', unpack(names, from, to))
	for i = from, to do
		if recs[names[i]] == nil then parse(names[i], vals[i - from + 1]) end
	end
end
if bad then
	return redis.error_reply('ONCEKIT_LAYOUT stock record ' .. bad)
end

-- expire ends a hold whose deadline passed: its units are free again.
local function expire(r, rk, key)
	held = held - r.units
	free = free + r.units
	r.st = 'x'
	set(rk, r, 'PX', r.keep)
	redis.call('ZREM', KEYS[2], key)
end

local expired = 0
for _, k in ipairs(due) do
	local rk = ARGV[1] .. k
	local r = get(rk)
	if r and r.st == 'h' then
		expire(r, rk, k)
		expired = expired + 1
	else
		redis.call('ZREM', KEYS[2], k)
	end
end

-- The reply: six values of the item (set last), then four per op.
local out = { 0, 0, 0, 0, 0, 0 }
local no = 6
local ki = 3
local plen = #ARGV[1]
for b = 2, #ARGV, 4 do
	local kind, units, ttl, keep = ARGV[b], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
	local st, u, rem, rep = 'n', units, 0, 0
	if kind == 's' then
		exists = true
		free, sold, put = units, 0, units + held
	elseif kind == 'a' then
		if free + units < 0 then
			st = 'o'
		else
			exists = true
			free = free + units
			put = put + units
		end
	elseif not exists then
		st = 'i'
	else
		local rk = KEYS[ki]
		ki = ki + 1
		local r = get(rk)
		if r and r.st == 'h' and r.dl <= now then
			expire(r, rk, string.sub(rk, plen + 1))
			expired = expired + 1
		end
		if kind == 't' or kind == 'h' then
			if r then
				u = r.units
				if r.kind ~= kind or r.units ~= units then
					st = 'm'
				else
					st, rep = r.st, 1
					if r.st == 'h' then rem = r.dl - now end
				end
			elseif free < units or kind == 't' then
				-- A new record of no deadline, made of the op's own
				-- arguments (decimal integers, as string.format would
				-- write them).
				if free < units then
					st = 'o'
				else
					free, sold, st = free - units, sold + units, 's'
				end
				local v = 'S1|' .. kind .. '|' .. st .. '|' .. ARGV[b + 1] .. '|0|' .. ARGV[b + 3]
				recs[rk] = v
				redis.call('SET', rk, v, 'PX', ARGV[b + 3])
			else
				free, held, st, rem = free - units, held + units, 'h', ttl
				set(rk, { kind = 'h', st = 'h', units = units, dl = now + ttl, keep = keep })
				redis.call('ZADD', KEYS[2], now + ttl, string.sub(rk, plen + 1))
			end
		else
			if not r then
				st, u = 'n', 0
			elseif r.kind ~= 'h' then
				st, u = 'm', r.units
			elseif r.st ~= 'h' then
				st, u, rep = r.st, r.units, 1
			else
				held, u = held - r.units, r.units
				if kind == 'c' then
					sold, r.st = sold + r.units, 's'
				else
					free, r.st = free + r.units, 'r'
				end
				st = r.st
				set(rk, r, 'PX', math.max(r.dl - now, 0) + r.keep)
				redis.call('ZREM', KEYS[2], string.sub(rk, plen + 1))
			end
		end
	end
	out[no + 1], out[no + 2], out[no + 3], out[no + 4] = st, u, rem, rep
	no = no + 4
end
if exists then
	redis.call('HSET', KEYS[1], 'v', 'S1', 'put', put, 'free', free, 'held', held, 'sold', sold)
end
out[1], out[2], out[3], out[4], out[5], out[6] = exists and 1 or 0, put, free, held, sold, expired
return out
