package testkit

import (
	"context"
	"testing"
	"time"
)

// CloseAtCleanup registers close (a node's, a session's Close) to run when t ends, under a
// context of its own that ends within after; its error is ignored (the test is over).
func CloseAtCleanup(t testing.TB, within time.Duration, close func(context.Context) error) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		_ = close(ctx)
	})
}
