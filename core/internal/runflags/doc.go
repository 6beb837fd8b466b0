// Package runflags holds the marks an integration puts on the context it
// passes to idem's Guard.Do (idemdriver sets them, idem reads them).
package runflags
