package txnode

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// hookLeaseClock runs before, once, before its first read returns: it stands for what other
// goroutines did while the reader waited for the CPU.
type hookLeaseClock struct {
	now    int64
	before func()
}

func (c *hookLeaseClock) nanos() int64 {
	if f := c.before; f != nil {
		c.before = nil
		f()
	}
	return c.now
}

// A renewal stored between serving's load of the lease and its clock read (the reader waited
// for the CPU there; more than a second under load) is what the time read is compared with:
// the table is served, and the renewed lease is not latched as lapsed. Fails on 35ab947: the
// stale lease compared with the later time failed the call with ErrLeaseExpired (seen in
// TestRenewalsUnderLoad while every renewal succeeded).
func TestServingSeesRenewalDuringClockRead(t *testing.T) {
	clock := &hookLeaseClock{now: 2000}
	ts := &tableState{name: "t", clock: clock}
	ts.leaseUntil.Store(1000) // the lease as the reader loads it: lapsed by the time it reads the clock
	clock.before = func() { ts.leaseUntil.Store(5000) }
	require.NoError(t, ts.serving())
	require.Equal(t, int64(5000), ts.leaseUntil.Load(), "the renewal stands")

	// A lease that did run out still fails, and latches.
	clock.now = 6000
	require.ErrorIs(t, ts.serving(), ErrLeaseExpired)
	require.Equal(t, int64(leaseLapsed), ts.leaseUntil.Load())
	clock.now = 0
	require.ErrorIs(t, ts.serving(), ErrLeaseExpired, "latched: a clock going back does not revive it")
}
