package wal

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
)

func TestAppendReplayAcrossRolls(t *testing.T) {
	fs := vfs.NewFaultFS()
	opts := Options{SegmentBytes: 1024}
	w, got := mustOpen(t, fs, opts)
	require.Empty(t, got)
	require.Equal(t, uint64(0), w.LastLSN())
	appendN(t, w, 1, 200)
	require.Equal(t, uint64(200), w.LastLSN())
	require.Equal(t, uint64(200), w.SyncedThrough())
	require.NoError(t, w.Close())
	require.NoError(t, w.Close(), "Close is idempotent")
	require.Greater(t, len(segments(t, fs)), 10)

	w, got = mustOpen(t, fs, opts)
	requireRecords(t, got, 1, 200)
	require.Equal(t, uint64(200), w.LastLSN())
	appendN(t, w, 201, 250)
	require.NoError(t, w.Close())

	for _, after := range []uint64{0, 1, 99, 200, 249, 250} {
		opts.After = after
		w, got = mustOpen(t, fs, opts)
		requireRecords(t, got, after+1, 250)
		require.NoError(t, w.Close())
	}
}

func TestOSRoundTrip(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SegmentBytes: 4096}
	w, err := Open(vfs.Default, dir, opts, nil)
	require.NoError(t, err)
	appendN(t, w, 1, 100)
	_, err = Open(vfs.Default, dir, opts, nil)
	require.ErrorIs(t, err, vfs.ErrLocked)
	require.NoError(t, w.Close())
	var n uint64
	w, err = Open(vfs.Default, dir, opts, func(r Record) error {
		n++
		require.Equal(t, n, r.LSN)
		require.Equal(t, payloadOf(n), append([]byte{}, r.Payload...))
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, uint64(100), n)
	require.NoError(t, w.Close())
}

func TestDropBefore(t *testing.T) {
	fs := vfs.NewFaultFS()
	opts := Options{SegmentBytes: 1024}
	w, _ := mustOpen(t, fs, opts)
	appendN(t, w, 1, 100)
	before := segments(t, fs)
	require.NoError(t, w.DropBefore(1))
	require.Equal(t, before, segments(t, fs))
	require.NoError(t, w.DropBefore(50))
	after := segments(t, fs)
	require.Less(t, len(after), len(before))
	first, _ := parseSegmentName(after[0])
	require.LessOrEqual(t, first, uint64(50), "the segment holding LSN 50 stays")
	require.NoError(t, w.DropBefore(1000))
	require.Len(t, segments(t, fs), 1, "the active segment stays")
	appendN(t, w, 101, 110)
	require.NoError(t, w.Close())

	last, _ := parseSegmentName(segments(t, fs)[0])
	opts.After = last - 1
	w, got := mustOpen(t, fs, opts)
	requireRecords(t, got, last, 110)
	require.NoError(t, w.Close())

	opts.After = last - 2 // record last-1 was dropped
	_, _, err := openCollect(t, fs, opts)
	require.ErrorIs(t, err, corrupt.ErrCorruption)
	require.ErrorContains(t, err, "missing")
}

func TestSyncModes(t *testing.T) {
	fs := vfs.NewFaultFS()
	w, _ := mustOpen(t, fs, Options{Sync: SyncNone})
	appendN(t, w, 1, 10)
	require.Equal(t, uint64(0), w.Stats().Syncs)
	require.Equal(t, uint64(0), w.SyncedThrough())
	lsn, err := w.Append(context.Background(), 1, [][]byte{[]byte("id grant")}, true)
	require.NoError(t, err)
	require.Equal(t, uint64(11), lsn)
	require.Equal(t, uint64(11), w.SyncedThrough(), "force syncs everything before it too")
	require.Equal(t, uint64(1), w.Stats().Syncs)
	appendN(t, w, 12, 15)
	require.Equal(t, uint64(11), w.SyncedThrough())
	require.NoError(t, w.Sync())
	require.Equal(t, uint64(15), w.SyncedThrough())
	require.NoError(t, w.Sync(), "nothing to sync")
	require.Equal(t, uint64(2), w.Stats().Syncs)
	st := w.Stats()
	require.Equal(t, uint64(15), st.Records)
	require.Equal(t, 7.5, st.RecordsPerSync)
	require.NoError(t, w.Close())

	// kill -9: the page cache keeps the unsynced records.
	w, _ = mustOpen(t, fs, Options{Sync: SyncNone})
	appendN(t, w, 16, 20)
	fs.CrashKeepAll()
	_ = w.Close()
	w, got := mustOpen(t, fs, Options{Sync: SyncNone})
	require.Len(t, got, 20)
	require.Equal(t, uint64(20), w.SyncedThrough(), "Open syncs what it recovered")
	require.NoError(t, w.Close())
}

func TestClosed(t *testing.T) {
	fs := vfs.NewFaultFS()
	w, _ := mustOpen(t, fs, Options{})
	var wg sync.WaitGroup
	var acked atomic.Int64
	for range 100 {
		wg.Add(1)
		require.NoError(t, w.AppendAsync(3, [][]byte{[]byte("x")}, false, func(lsn uint64, err error) {
			defer wg.Done()
			if err == nil {
				acked.Add(1)
			}
		}))
	}
	require.NoError(t, w.Close())
	wg.Wait()
	require.Equal(t, int64(100), acked.Load(), "Close finishes queued appends")
	require.Equal(t, uint64(100), w.SyncedThrough())
	_, err := w.Append(context.Background(), 1, nil, false)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, w.AppendAsync(1, nil, false, func(uint64, error) { t.Error("called") }), ErrClosed)
	require.ErrorIs(t, w.Sync(), ErrClosed)
}

func TestBadArguments(t *testing.T) {
	fs := vfs.NewFaultFS()
	_, err := Open(fs, testDir, Options{Sync: 9}, nil)
	require.ErrorIs(t, err, ErrBadOptions)
	_, err = Open(fs, testDir, Options{MaxRecordBytes: 2 << 30}, nil)
	require.ErrorIs(t, err, ErrBadOptions)
	w, _ := mustOpen(t, fs, Options{MaxRecordBytes: 100})
	_, err = w.Append(context.Background(), 1, [][]byte{make([]byte, 60), make([]byte, 41)}, false)
	require.ErrorIs(t, err, ErrTooLarge)
	lsn, err := w.Append(context.Background(), 1, [][]byte{make([]byte, 60), make([]byte, 40)}, false)
	require.NoError(t, err)
	require.Equal(t, uint64(1), lsn)
	lsn, err = w.Append(context.Background(), 1, nil, false)
	require.NoError(t, err, "empty payloads are records too")
	require.Equal(t, uint64(2), lsn)
	_, err = Open(fs, testDir, Options{}, nil)
	require.ErrorIs(t, err, vfs.ErrLocked)
}

func TestReplayError(t *testing.T) {
	fs := vfs.NewFaultFS()
	w, _ := mustOpen(t, fs, Options{})
	appendN(t, w, 1, 5)
	require.NoError(t, w.Close())
	stop := errors.New("stop")
	_, err := Open(fs, testDir, Options{}, func(r Record) error {
		if r.LSN == 3 {
			return stop
		}
		return nil
	})
	require.ErrorIs(t, err, stop)
	w, got := mustOpen(t, fs, Options{}) // the lock was released
	requireRecords(t, got, 1, 5)
	require.NoError(t, w.Close())
}

// blockSyncs makes every Sync of fs wait until the returned release is called.
func blockSyncs(fs *vfs.FaultFS) (entered <-chan struct{}, release func()) {
	in := make(chan struct{}, 1)
	gate := make(chan struct{})
	fs.Inject(func(op vfs.Op) error {
		if op.Kind == vfs.OpSync {
			select {
			case in <- struct{}{}:
			default:
			}
			<-gate
		}
		return nil
	})
	var once sync.Once
	return in, func() { once.Do(func() { close(gate) }) }
}

func TestQueueBound(t *testing.T) {
	fs := vfs.NewFaultFS()
	w, _ := mustOpen(t, fs, Options{MaxQueueBytes: 1024})
	entered, release := blockSyncs(fs)
	defer release()
	results := make(chan error, 100)
	done := func(lsn uint64, err error) { results <- err }
	require.NoError(t, w.AppendAsync(1, [][]byte{make([]byte, 100)}, false, done))
	<-entered // the writer holds record 1 in its sync; the queue is empty
	queued := 0
	for {
		err := w.AppendAsync(1, [][]byte{make([]byte, 100)}, false, done)
		if errors.Is(err, ErrBusy) {
			break
		}
		require.NoError(t, err)
		queued++
	}
	require.Equal(t, 1024/recordSize(100), queued)
	// Room, taken before the refused AppendAsync, is closed once the writer takes the queue.
	room := w.Room()
	require.ErrorIs(t, w.AppendAsync(1, [][]byte{make([]byte, 100)}, false, done), ErrBusy)
	select {
	case <-room:
		require.Fail(t, "room while the writer is stuck")
	default:
	}
	// A record larger than the bound waits for an empty queue.
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	_, err := w.Append(ctx, 1, [][]byte{make([]byte, 2000)}, false)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	big := make(chan error, 1)
	go func() {
		_, err := w.Append(context.Background(), 1, [][]byte{make([]byte, 2000)}, false)
		big <- err
	}()
	release()
	<-room
	for range queued + 1 {
		require.NoError(t, <-results)
	}
	require.NoError(t, <-big)
	require.Equal(t, uint64(queued+2), w.LastLSN())
	require.NoError(t, w.Close())
}

func TestUnknownOutcome(t *testing.T) {
	fs := vfs.NewFaultFS()
	w, _ := mustOpen(t, fs, Options{})
	entered, release := blockSyncs(fs)
	defer release()
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() {
		_, err := w.Append(ctx, 1, [][]byte{[]byte("x")}, false)
		res <- err
	}()
	<-entered
	cancel()
	err := <-res
	require.ErrorIs(t, err, ErrUnknownOutcome)
	require.ErrorIs(t, err, context.Canceled)
	release()
	require.NoError(t, w.Sync())
	require.Equal(t, uint64(1), w.SyncedThrough())
	require.NoError(t, w.Close())
}

// TestConcurrentAppends runs 64 appending goroutines: callbacks come in LSN order, the writer
// groups records into syncs, and a reopen finds every record once.
func TestConcurrentAppends(t *testing.T) {
	fs := vfs.NewFaultFS()
	// A sync that takes a little while, like a disk's, lets groups build.
	fs.Inject(func(op vfs.Op) error {
		if op.Kind == vfs.OpSync {
			time.Sleep(100 * time.Microsecond)
		}
		return nil
	})
	opts := Options{SegmentBytes: 64 << 10}
	w, _ := mustOpen(t, fs, opts)
	const goroutines, perGoroutine = 64, 50
	var lastDone atomic.Uint64
	var outOfOrder atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range perGoroutine {
				p := []byte{byte(g), byte(i), 7, 7, 7}
				if i%2 == 0 {
					_, err := w.Append(context.Background(), byte(g), [][]byte{p}, false)
					require.NoError(t, err)
					continue
				}
				ch := make(chan error, 1)
				require.NoError(t, w.AppendAsync(byte(g), [][]byte{p}, i%10 == 1, func(lsn uint64, err error) {
					if lsn <= lastDone.Load() { // Append's records are not seen here
						outOfOrder.Add(1)
					}
					lastDone.Store(lsn)
					ch <- err
				}))
				require.NoError(t, <-ch)
			}
		})
	}
	wg.Wait()
	require.Zero(t, outOfOrder.Load())
	st := w.Stats()
	t.Logf("stats: %+v", st)
	require.Equal(t, uint64(goroutines*perGoroutine), st.Records)
	require.Greater(t, st.RecordsPerSync, 1.5, "records per sync under load")
	require.NoError(t, w.Close())

	fs.Inject(nil)
	w, got := mustOpen(t, fs, opts)
	require.Len(t, got, goroutines*perGoroutine)
	seen := map[[2]byte]bool{}
	for _, r := range got {
		require.Len(t, r.Payload, 5)
		require.Equal(t, r.Kind, r.Payload[0])
		key := [2]byte{r.Payload[0], r.Payload[1]}
		require.False(t, seen[key], "duplicate %v", key)
		seen[key] = true
	}
	require.NoError(t, w.Close())
}

// TestCallbackReentry checks that a done callback may queue another record.
func TestCallbackReentry(t *testing.T) {
	fs := vfs.NewFaultFS()
	w, _ := mustOpen(t, fs, Options{})
	res := make(chan uint64, 2)
	require.NoError(t, w.AppendAsync(1, nil, false, func(lsn uint64, err error) {
		require.NoError(t, err)
		res <- lsn
		require.NoError(t, w.AppendAsync(2, nil, false, func(lsn uint64, err error) {
			require.NoError(t, err)
			res <- lsn
		}))
	}))
	require.Equal(t, uint64(1), <-res)
	require.Equal(t, uint64(2), <-res)
	require.NoError(t, w.Close())
	_, got := mustOpen(t, fs, Options{})
	require.Equal(t, []rec{{1, 1, []byte{}}, {2, 2, []byte{}}}, got)
}

// With SyncAlways and Gather the writer gathers: after a synced group it waits (bounded by GatherWait)
// for the group's appenders to append again, so one sync covers them and the records that
// queued during the previous sync. Record 1 is synced alone while 2-4 queue; its appender is
// back with record 5, and 2-5 go in one group. Without gathering, 2-4 are cut at once and 5
// needs a third group and sync.
func TestGroupGathersReturningAppenders(t *testing.T) {
	fs := vfs.NewFaultFS()
	w, _ := mustOpen(t, fs, Options{Gather: true, GatherWait: time.Minute}) // never reached: 4 records come
	defer w.Close()
	entered, release := blockSyncs(fs)
	acked := make(chan uint64, 8)
	done := func(lsn uint64, err error) {
		require.NoError(t, err)
		acked <- lsn
	}
	require.NoError(t, w.AppendAsync(1, [][]byte{payloadOf(1)}, false, done))
	<-entered // record 1 is in its sync
	for lsn := uint64(2); lsn <= 4; lsn++ {
		require.NoError(t, w.AppendAsync(1, [][]byte{payloadOf(lsn)}, false, done))
	}
	release()
	require.Equal(t, uint64(1), <-acked)
	// The writer gathers now, so no second sync starts until record 5 arrives. (The window
	// only makes a writer that cuts at once, as before gathering, fail; it never fails a
	// gathering one.)
	select {
	case <-entered:
		t.Fatal("records 2-4 were cut without waiting for record 1's appender")
	case <-time.After(50 * time.Millisecond):
	}
	require.NoError(t, w.AppendAsync(1, [][]byte{payloadOf(5)}, false, done)) // the appender is back
	for lsn := uint64(2); lsn <= 5; lsn++ {
		require.Equal(t, lsn, <-acked)
	}
	st := w.Stats()
	require.Equal(t, uint64(2), st.Groups, "records 2-5 in one group")
	require.Equal(t, uint64(2), st.Syncs)
}

// Gathering is bounded: appenders that do not come back cost at most GatherWait, and Sync
// and Close cut the wait short.
func TestGroupGatherBounded(t *testing.T) {
	fs := vfs.NewFaultFS()
	w, _ := mustOpen(t, fs, Options{Gather: true, GatherWait: time.Millisecond})
	entered, release := blockSyncs(fs)
	acked := make(chan error, 8)
	done := func(_ uint64, err error) { acked <- err }
	require.NoError(t, w.AppendAsync(1, [][]byte{payloadOf(1)}, false, done))
	<-entered
	require.NoError(t, w.AppendAsync(1, [][]byte{payloadOf(2)}, false, done))
	release() // record 1's appender never comes back: record 2 waits 1 ms, then goes alone
	require.NoError(t, <-acked)
	require.NoError(t, <-acked)

	// A long gather ends at Sync and at Close: record 1 syncs alone while 2 and 3 queue, so
	// the next group waits for a third record that never comes.
	for _, end := range []string{"sync", "close"} {
		fs2 := vfs.NewFaultFS()
		w2, _ := mustOpen(t, fs2, Options{Gather: true, GatherWait: time.Hour})
		entered, release := blockSyncs(fs2)
		require.NoError(t, w2.AppendAsync(1, [][]byte{payloadOf(1)}, false, done))
		<-entered
		require.NoError(t, w2.AppendAsync(1, [][]byte{payloadOf(2)}, false, done))
		require.NoError(t, w2.AppendAsync(1, [][]byte{payloadOf(3)}, false, done))
		release()
		require.NoError(t, <-acked)
		if end == "sync" {
			require.NoError(t, w2.Sync())
		}
		require.NoError(t, w2.Close())
		require.NoError(t, <-acked, end)
		require.NoError(t, <-acked, end)
	}
	require.NoError(t, w.Close())
}
