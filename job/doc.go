// Package job runs scheduled jobs once per tick across every replica that
// shares a store, whatever their clocks say.
//
//	sched, _ := cron.ParseStandard("0 3 * * *") // robfig/cron/v3, or job.Every(time.Hour)
//	err := job.Run(ctx, store, "nightly-report", sched, func(ctx context.Context, t job.Tick) error {
//		return report.Build(ctx, t.At) // t.Fence goes to what the run writes
//	})
//
// Each replica calls Run with the same name and schedule. A tick's
// identity is the job's name and its scheduled time, never the moment a
// replica's clock reached it: the first replica to reach a tick claims it
// through an idem.Guard and runs it, a replica whose clock is late finds
// it done and goes on to the next, and one that reaches it while it runs
// waits for it, taking it over if the runner dies (its claim's TTL) or
// gives up (an error). So a tick runs once, and again only after a failed
// or crashed run, on another replica.
//
// Ticks are instants every replica agrees on: the schedule is asked in
// UTC, so "0 3 * * *" runs at 03:00 UTC once a day on replicas in any
// zone, and daylight saving neither doubles nor drops a tick. A schedule
// that names its zone ("CRON_TZ=America/New_York 30 1 * * *") runs by that
// zone's wall clock instead, and then follows robfig/cron across its
// daylight-saving days.
//
// Runs never overlap unless asked (WithOverlap): a tick holds the job's
// lock (lock.Mutex: its context ends if the lock is lost, before another
// replica can take it) while it runs, and a tick that comes while the
// previous run still holds it waits for it until the tick after (or for
// the TTL, if that is later: the time a dead run's lock takes to free),
// and is skipped if it is still held then. Every replica looks at every
// tick in turn, also those that came while it ran or waited: so a tick
// that came during a long run runs as soon as the lock is free, within
// its time, and each tick of a running fleet either runs once or is
// reported skipped (ErrSkipped, to WithOnError) once, on the replica that
// recorded it. A replica that was stopped for more than 1000 ticks reports
// the rest together and goes on from the current tick. Ticks missed while
// no replica ran are skipped, unless WithCatchUp asks for the latest of
// them to run when a replica starts.
//
// A run answers when it returns, as a middleware's does: idem.Commit in a
// run refuses an effect the caller's own transaction commits
// (sqlstore.InTx; idem.ErrCallerCommits), whose tick would stay in flight;
// commit with the record instead (sqlstore.Effect).
//
// Any lock.Locker that is also an idemdriver.Store serves: every oncekit driver
// does. Claims and locks report through the store's observer (package
// observe), as the Guard and the Mutex do.
package job
