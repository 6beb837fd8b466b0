// Package layouttest writes and checks the golden layouts of the Redis
// drivers' records and locks (layouts.Layout): the values a released
// version wrote, planted as they were on every node and judged by this
// version.
package layouttest
