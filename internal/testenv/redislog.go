package testenv

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"
)

// quietLogger drops go-redis's reports of failed dials, which fault tests
// provoke on purpose (stopped and paused servers), and its notes on which
// sentinel it asked, and passes the rest on.
type quietLogger struct{}

func (quietLogger) Printf(_ context.Context, format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if strings.Contains(msg, "failed to dial") || strings.Contains(msg, "connection refused") || strings.Contains(msg, "sentinel: selected") || strings.Contains(msg, "sentinel: new master") {
		return
	}
	fmt.Fprintln(os.Stderr, "redis:", msg)
}

// QuietRedisDialErrors silences go-redis's log lines about failed dials for
// the rest of the test binary; call it from TestMain or a test that stops
// servers on purpose.
func QuietRedisDialErrors() { redis.SetLogger(quietLogger{}) }
