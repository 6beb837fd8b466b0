// Package rediskit is the base redisstore and redlockstore share: the Lua
// scripts (each in its own file under lua/, created once and sent as
// EVALSHA), their typed replies with named codes, the naming of every
// Redis key and channel, the options both drivers take and their
// validation, the waiting-queue protocol (join, leave, wake grace, a
// process's own channel) and the idempotency record calls. A driver keeps
// only what is its own: one server or a quorum of N.
package rediskit
