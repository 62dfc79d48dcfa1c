package txnode

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/storenode"
)

// Defects found in the hostile review of issue 10's work.

// A call made while the remote store reconnects honours its context: it returns ctx's error
// when the context ends, not when reconnecting ends (RequestTimeout, or a lease plus a margin
// while the owner id is in use). Fails before the fix, where client() waited on the store's
// condition without waking on the context.
func TestRemoteCallDuringReconnectHonoursContext(t *testing.T) {
	addr, srv := startIdentityNode(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone})
	opts := Options{StoreAddr: addr, OwnerID: 77, RequestTimeout: 10 * time.Minute}.withDefaults()
	st, err := dialStore(context.Background(), opts)
	require.NoError(t, err)
	rs := st.(*remoteStore)
	t.Cleanup(func() { rs.Close() })
	_, err = rs.CreateTable(context.Background(), "t", 64)
	require.NoError(t, err)

	require.NoError(t, srv.Shutdown(context.Background())) // the store reconnects, in vain
	deadline := time.Now().Add(time.Minute)
	for {
		rs.mu.Lock()
		dialing := rs.dialing
		rs.mu.Unlock()
		if dialing {
			break
		}
		require.True(t, time.Now().Before(deadline), "the store never started reconnecting")
		runtime.Gosched()
	}

	// The context ends while the call waits for the new connection (a deadline, so the call
	// is very likely waiting by then; if it is not, it sees the ended context at once).
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := rs.OpenTable(ctx, "t")
		done <- err
	}()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(20 * time.Second):
		t.Fatal("OpenTable ignored its context while the store reconnects")
	}
}
