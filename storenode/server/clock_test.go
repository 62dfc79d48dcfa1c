package server

import (
	"sync"
	"time"
)

// fakeClock is an injectable clock for leases.
type fakeClock struct {
	mu *sync.Mutex
	t  *time.Time
}

func (c *fakeClock) init() {
	if c.mu == nil {
		c.mu = new(sync.Mutex)
		t := time.Unix(1_700_000_000, 0)
		c.t = &t
	}
}

func (c *fakeClock) Now() time.Time {
	c.init()
	c.mu.Lock()
	defer c.mu.Unlock()
	return *c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.init()
	c.mu.Lock()
	*c.t = c.t.Add(d)
	c.mu.Unlock()
}
