// Package doccheck holds the tests that keep the repository's documents
// from drifting away from the code: every list of drivers names all of
// them, every pkg.Name a comment or a document mentions exists, every
// library package has a doc.go, and the README stays short. It has no code
// of its own.
package doccheck
