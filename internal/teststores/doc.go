// Package teststores opens every store configuration the README's tables
// list — each driver, and the Redis and Redlock drivers also without
// fences — on the servers of `make services-up`, for the tests of the
// packages built over any store (job, lead, gocronjob). A configuration
// whose servers are not configured skips (fails under
// ONCEKIT_REQUIRE_SERVERS=1).
package teststores
