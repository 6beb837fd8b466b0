// Package token makes the random per-acquisition tokens that identify a
// lease's holder.
package token
