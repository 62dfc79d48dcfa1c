package server

import "github.com/weftdb/weft/internal/testclock"

// fakeClock is the injectable clock of the lease tests.
type fakeClock = testclock.Fake
