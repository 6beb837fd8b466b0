package inventory

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/oncekit/oncekit/job"
)

// reportJob is Config's report: a job of the inventory's own.
type reportJob struct {
	every time.Duration
	name  string
	to    io.Writer
}

// Report logs the sale's totals at every multiple of Config.ReportEvery,
// once across every replica of the inventory (job.Run: the tick's time is
// its key, so replicas whose clocks disagree still report each tick once),
// until ctx ends. It returns at once when ReportEvery is not positive.
// Start runs it on every replica.
func (s *Service) Report(ctx context.Context) error {
	r := s.report
	if r.every <= 0 {
		return nil
	}
	return job.Run(ctx, s.store, r.name, job.Every(r.every), func(ctx context.Context, t job.Tick) error {
		orders, shipments, err := s.backend.Counts(ctx)
		if err != nil {
			return err // another replica, or the next tick, reports
		}
		_, err = fmt.Fprintf(r.to, "inventory report at %s: %d orders, %d shipped, %d awaiting shipment\n",
			t.At.Format(time.RFC3339Nano), orders, shipments, orders-shipments)
		return err
	}, job.WithOverlap()) // a report needs no lock: each tick once is all it asks
}
