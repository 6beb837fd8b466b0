//go:build !race

package locktest

const raceEnabled = false
