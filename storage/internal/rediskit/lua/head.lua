-- The first line of a script that has no fast path (see fence.lua).
local clock_read = nil
