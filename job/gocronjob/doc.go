// Package gocronjob gives go-co-op/gocron v2 schedulers oncekit's locks,
// for teams that already schedule with gocron:
//
//	locker, err := gocronjob.NewLocker(store) // any lock.Locker: every oncekit driver
//	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
//
// Every replica runs the same scheduler; at each run, the replica that
// takes the job's lock runs it and the others skip it. gocron's locker
// sees the job's name, not the run's scheduled time, so the lock is held
// at least WithHoldAtLeast (1 s by default) after it was taken, whatever
// the job's length: a replica whose clock is behind by less than that finds
// it held and skips (ShedLock's lockAtLeastFor). Across larger skews, or
// for a run that must be remembered as done, use job.Run, which keys each
// tick on its scheduled time. For leader-only scheduling,
// gocron.WithDistributedElector takes a lead.Elector.
package gocronjob
