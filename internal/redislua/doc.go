// Package redislua holds the Lua scripts the Redis drivers run. Each is
// created once and sent as EVALSHA (EVAL on the first NOSCRIPT).
package redislua
