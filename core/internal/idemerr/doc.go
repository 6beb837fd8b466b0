// Package idemerr holds the corrupt-record error that idem reports and
// idemdriver's drivers make.
package idemerr
