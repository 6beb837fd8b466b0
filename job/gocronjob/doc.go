// Package gocronjob gives go-co-op/gocron v2 schedulers oncekit's locks,
// for teams that already schedule with gocron:
//
//	locker, err := gocronjob.NewLocker(store) // any lock.Locker: every oncekit driver
//	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
//
// Every replica runs the same scheduler; at each tick, the replica that
// takes the job's lock runs it and the others skip it. gocron's Locker
// sees the job's name, not the tick's scheduled time, so a run holds the
// lock for a while however short it is, and a replica whose tick of the
// same period comes later finds it held. The hold is learned from the
// scheduler itself: gocron asks for the lock at every tick, so after a
// replica has seen two of a job's ticks it knows the period P (the
// shortest gap, for a cron schedule), and a run holds the lock for P less
// a quarter of P, at most a second less. A replica's first tick, before
// it knows P, holds for WithHoldAtLeast (900 ms by default). So, at the
// defaults, a job of any period from a second up runs once per period
// across the replicas:
//
//   - a CronJob ticks at the same wall-clock time on every replica: its
//     runs are once per tick while the replicas' clocks and the store's
//     round trip stay within P/4 (at most a second) of each other;
//   - a DurationJob ticks at each replica's own start plus multiples of
//     P, so its replicas' ticks are spread over the period; once each
//     replica has seen two ticks, runs are one per period whatever the
//     spread (the first run after the hold ends takes the period). During
//     a replica's first period its hold is WithHoldAtLeast, which must
//     exceed the spread of the replicas' first ticks: start DurationJobs
//     aligned (gocron.WithStartAt at a multiple of P, as gocron's own
//     documentation advises) or use a CronJob when replicas start far
//     apart.
//
// Bounds: WithHoldAtLeast must exceed the splay of the replicas' first
// ticks and stay below P minus the store's round trip; a period shorter
// than WithHoldAtLeast is not learned (lower the hold for such jobs). A
// job's RunNow counts as a tick of it. Runs are not remembered as done:
// for a run that must be (across larger skews, crashes mid-run, catch-up),
// use job.Run, which keys each tick on its scheduled time. For
// leader-only scheduling, gocron.WithDistributedElector takes a
// lead.Elector.
package gocronjob
