package sched

import (
	"sort"
	"sync"
	"time"
)

// fakeClock is a Clock that moves only when a test advances it.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c       *fakeClock
	at      time.Time
	f       func()
	stopped bool
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

// Advance moves the clock by d, running due timers in order (outside the
// clock's lock, as real timers run on their own).
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	for {
		sort.Slice(c.timers, func(i, j int) bool { return c.timers[i].at.Before(c.timers[j].at) })
		var due *fakeTimer
		for len(c.timers) > 0 {
			t := c.timers[0]
			if t.stopped {
				c.timers = c.timers[1:]
				continue
			}
			if t.at.After(end) {
				break
			}
			due = t
			c.timers = c.timers[1:]
			break
		}
		if due == nil {
			break
		}
		if due.at.After(c.now) {
			c.now = due.at
		}
		due.stopped = true
		c.mu.Unlock()
		due.f()
		c.mu.Lock()
	}
	c.now = end
	c.mu.Unlock()
}
