// Package doccheck holds the tests that keep the repository's documents
// from drifting away from the code: every list of drivers names all of
// them, and the README stays short. It has no code of its own.
package doccheck
