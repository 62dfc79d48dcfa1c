package testkit

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// SpinUntil spins (yielding) until cond reports true, failing t with what after within.
// cond runs on the test's goroutine; it is for waiting on another goroutine's state, never
// a sleep standing in for synchronisation.
func SpinUntil(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		require.True(t, time.Now().Before(deadline), what)
		runtime.Gosched()
	}
}
