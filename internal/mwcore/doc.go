// Package mwcore is what oncekit's HTTP, gRPC and Kafka layers do alike,
// so that they cannot drift apart: the configuration every one of them
// takes (the explicit choice of a key space, the wait override, failing
// open) and the reading of a Guard's answer into the few cases each
// protocol then answers in its own terms. It is not a promise: only the
// middleware packages use it.
package mwcore
