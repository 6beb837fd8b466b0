// Package layouts writes and checks the golden stored layouts of the
// drivers (CONTRIBUTING.md, "Stored formats that never change"): the
// values a released version stored, planted as they were and judged by
// this version. Only the drivers' tests use it.
package layouts
