package wal

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/vfs"
)

// TestGroupCommitCoversArrivals checks the group-commit rule of docs/wal.md ("Writing: group
// commit"): under SyncAlways the next sync starts as soon as the previous one ended and its
// callbacks ran, and it covers every record that arrived meanwhile: while sync N runs, from
// the done callbacks of sync N's records, or both. None of them waits for sync N+2, and
// nothing arrives out of a group: each round below is exactly one write and one sync.
//
// Every sync of the log's segment is held by the test until it has queued that round's
// records; a record's done callback notes the number of the sync that covered it (callbacks
// run on the writer goroutine after its sync and before the next one starts).
func TestGroupCommitCoversArrivals(t *testing.T) {
	rounds := 40
	if testing.Short() {
		rounds = 10
	}
	fs := vfs.NewFaultFS()
	w, _ := mustOpen(t, fs, Options{Sync: SyncAlways})

	var syncs atomic.Int64
	var free atomic.Bool // set at the end: Close's syncs are not held
	entered := make(chan int64, rounds+2)
	proceed := make(chan struct{})
	fs.Inject(func(op vfs.Op) error {
		if op.Kind != vfs.OpSync || free.Load() {
			return nil
		}
		n := syncs.Add(1)
		entered <- n
		<-proceed
		return nil
	})
	defer func() {
		free.Store(true)
		close(proceed)
	}()

	type result struct {
		lsn, want uint64 // want: the sync that must cover it
		err       error
		covered   int64
	}
	results := make(chan result, 1<<14)
	var mu sync.Mutex
	want := map[uint64]uint64{} // lsn -> sync that must cover it
	var done func(lsn uint64, err error)
	// fromCallback: records to append from the callback of the record with that LSN; they
	// arrive after their sync ended, before the next one starts.
	fromCallback := map[uint64]int{}
	appendFor := func(sync uint64) {
		require.NoError(t, w.AppendAsync(1, [][]byte{payloadOf(uint64(len(want)))}, false, done))
		want[w.LastLSN()] = sync
	}
	done = func(lsn uint64, err error) {
		mu.Lock()
		defer mu.Unlock()
		results <- result{lsn: lsn, want: want[lsn], err: err, covered: syncs.Load()}
		for range fromCallback[lsn] {
			if err := w.AppendAsync(1, [][]byte{payloadOf(lsn)}, false, done); err != nil {
				results <- result{err: err}
				return
			}
			want[w.LastLSN()] = uint64(syncs.Load()) + 1
		}
	}

	rng := rand.New(rand.NewPCG(uint64(rounds), 13))
	mu.Lock()
	appendFor(1)
	mu.Unlock()
	expected := 1
	timeout := time.After(testTimeout)
	for round := int64(1); round <= int64(rounds); round++ {
		select {
		case n := <-entered:
			require.Equal(t, round, n)
		case <-timeout:
			require.FailNow(t, "sync did not start", "round %d", round)
		}
		// Sync `round` is running: queue this round's arrivals for sync round+1, and ask
		// the callback of this round's last record for more (also for sync round+1).
		mu.Lock()
		k := 1 + rng.IntN(64)
		for range k {
			appendFor(uint64(round) + 1)
		}
		expected += k
		if round < int64(rounds) && rng.IntN(2) == 0 {
			last := uint64(0)
			for lsn, s := range want {
				if s == uint64(round) && lsn > last {
					last = lsn
				}
			}
			if last != 0 && fromCallback[last] == 0 {
				c := 1 + rng.IntN(8)
				fromCallback[last] = c
				expected += c
			}
		}
		mu.Unlock()
		if round == int64(rounds) {
			break // the last round's records are synced by Close
		}
		proceed <- struct{}{}
	}
	// Sync number rounds is held; let it and the ones after it run unheld.
	free.Store(true)
	proceed <- struct{}{}
	require.NoError(t, w.Close())
	close(results)
	got := 0
	for r := range results {
		require.NoError(t, r.err)
		got++
		if r.want <= uint64(rounds) { // the final round's records go to Close's sync
			require.Equal(t, int64(r.want), r.covered, "record %d", r.lsn)
		}
	}
	require.Equal(t, expected, got)
	st := w.Stats()
	require.Equal(t, uint64(rounds+1), st.Syncs, "one sync per round, one for Close")
	require.Equal(t, uint64(rounds+1), st.Groups, "one write per round")
}
