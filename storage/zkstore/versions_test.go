package zkstore

import (
	"fmt"
	"testing"
	"time"
)

// Entries of claims nobody finished go once their lease is a minute past;
// live ones stay.
func TestVersionCacheForgetsUnfinishedClaims(t *testing.T) {
	var c versionCache
	c.store("live", 7, time.Hour)
	for i := range 255 {
		c.store(fmt.Sprint("gone-", i), 1, -2*forgetAfter)
	}
	if v, ok := c.load("live"); !ok || v != 7 {
		t.Fatalf("live entry: %d %v", v, ok)
	}
	if n := c.size(); n != 1 {
		t.Errorf("%d entries after 256 stores, want the live one only", n)
	}
}
