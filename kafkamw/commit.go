package kafkamw

import (
	"context"
	"time"
)

// maxCommitFails is how often one partition's offset may fail to commit
// before it is dropped: a partition taken away at a rebalance may refuse
// commits for good, and not committing is always safe (its messages are
// read again and found done).
const maxCommitFails = 3

// commitLoop commits offsets whenever messages are done, until stop is
// closed; then it commits once more.
func (c *Consumer) commitLoop(stop <-chan struct{}) {
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-c.kick:
		case <-retry.C:
		case <-stop:
			for range maxCommitFails {
				if c.commit() == nil {
					return
				}
			}
			return
		}
		if c.commit() != nil {
			retry.Reset(c.cfg.backoff)
		}
	}
}

// commit moves each lane past its done prefix and commits the offset of the
// last message of every prefix: never a message before it that is not
// done, never an offset lower than one committed already.
func (c *Consumer) commit() error {
	c.mu.Lock()
	for p, l := range c.lanes {
		var last *entry
		for len(l.pending) > 0 && l.pending[0].done {
			last = l.pending[0]
			l.pending[0] = nil
			l.pending = l.pending[1:]
		}
		if last == nil {
			continue
		}
		if done, ok := c.committed[p]; ok && done >= last.msg.Offset {
			continue
		}
		c.toCommit[p] = &candidate{msg: last.msg}
	}
	msgs := make([]Message, 0, len(c.toCommit))
	for _, cand := range c.toCommit {
		msgs = append(msgs, cand.msg)
	}
	c.mu.Unlock()
	if len(msgs) == 0 {
		return nil
	}

	ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
	err := c.r.CommitMessages(ctx, msgs...)
	cancel()

	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.stats.CommitErrors++
		for p, cand := range c.toCommit {
			if cand.fails++; cand.fails >= maxCommitFails {
				delete(c.toCommit, p)
			}
		}
		return err
	}
	c.stats.Commits++
	for _, m := range msgs {
		p := partition{m.Topic, m.Partition}
		if done, ok := c.committed[p]; !ok || done < m.Offset {
			c.committed[p] = m.Offset
		}
		if cand, ok := c.toCommit[p]; ok && cand.msg.Offset <= m.Offset {
			delete(c.toCommit, p)
		}
	}
	return nil
}
