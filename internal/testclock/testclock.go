// Package testclock is the injectable clock of tests that control leases and deadlines: a
// Fake reads a time that moves only when the test advances it. The zero value is ready (it
// starts at a fixed instant), and copies share one time, so a Fake can be handed out by value.
// Any goroutine may call its methods.
package testclock

import (
	"sync"
	"time"
)

// Fake is a clock that moves only by Advance.
type Fake struct {
	mu *sync.Mutex
	t  *time.Time
}

// start is where every Fake begins.
var start = time.Unix(1_700_000_000, 0)

func (c *Fake) init() {
	if c.mu == nil {
		c.mu = new(sync.Mutex)
		t := start
		c.t = &t
	}
}

// Now returns the clock's time.
func (c *Fake) Now() time.Time {
	c.init()
	c.mu.Lock()
	defer c.mu.Unlock()
	return *c.t
}

// Advance moves the clock on by d.
func (c *Fake) Advance(d time.Duration) {
	c.init()
	c.mu.Lock()
	*c.t = c.t.Add(d)
	c.mu.Unlock()
}

// After is a timer for code that waits on the clock: it advances the clock by d and returns
// a channel that has fired, so a wait of d takes no real time and the clock shows it passed.
func (c *Fake) After(d time.Duration) <-chan time.Time {
	c.Advance(d)
	ch := make(chan time.Time, 1)
	ch <- c.Now()
	return ch
}
