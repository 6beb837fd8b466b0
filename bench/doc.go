// Package bench compares oncekit with peer libraries on the same servers in
// one run. It is a module of its own so that the peers (bsm/redislock,
// go-redsync/redsync) never enter oncekit's go.mod.
//
//	make bench   # starts the servers, runs everything, stops them
//
// Results and the machine they ran on are written up in BENCHMARKS.md.
package bench
