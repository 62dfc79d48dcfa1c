package txnode

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/txnode/store"
)

// Sessions: one goroutine keeps thousands of transactions in flight. Their pendings resolve
// in the order they were issued, Flush waits for all of them, and errors reach the pendings
// they belong to: a closure's error its own, a failed batch every later one.

// resolved reports whether p has resolved, without waiting: Wait with an ended context
// returns at once, nil when p is durable.
func resolved(p *Pending) (bool, error) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := p.Wait(ctx)
	if errors.Is(err, ErrUnknownOutcome) {
		return false, nil
	}
	return true, err
}

// checkIssueOrder asserts that the pendings resolved so far are a prefix of ps (a pending
// whose transaction failed when it was issued is resolved from the start). Durability only
// grows while we look, so it looks from the last pending back: once one has resolved, every
// earlier one must have too.
func checkIssueOrder(t *testing.T, ps []*Pending) int {
	t.Helper()
	done := -1
	for i := len(ps) - 1; i >= 0; i-- {
		ok, _ := resolved(ps[i])
		if ok && ps[i].err == nil && done < 0 {
			done = i + 1
		}
		if done >= 0 {
			require.True(t, ok, "pending %d resolved before %d, issued earlier", done-1, i)
		}
	}
	return max(done, 0)
}

func TestSessionInFlight(t *testing.T) {
	n := 20_000
	if testing.Short() {
		n = 3000
	}
	ctx := context.Background()
	eachConfig(t, openConfigs(t), Options{}, func(t *testing.T, db *DB) {
		tb, ids := newTableRows(t, ctx, db, "counters", 64)
		s := db.Session()
		var ps []*Pending
		errOdd := errors.New("odd one out")
		want := make(map[uint64]uint64) // counter in word 1
		buf := make([]byte, 64)
		for _, id := range ids {
			require.NoError(t, tb.Get(ctx, id, buf))
			want[id] = binary.LittleEndian.Uint64(buf[8:])
		}
		for i := range n {
			id := ids[i%len(ids)]
			var p *Pending
			switch {
			case i%1000 == 999: // a closure that fails: only its own pending says so
				p = s.Go(ctx, func(tx *Tx) error {
					require.NoError(t, tx.Put(tb, id, u64Row(64, 0)))
					return errOdd
				})
				require.ErrorIs(t, p.Wait(ctx), errOdd)
			case i%100 == 50: // read-only: resolves after the writes issued before it
				p = s.Go(ctx, func(tx *Tx) error {
					buf := make([]byte, 64)
					return tx.Get(tb, id, buf)
				})
			default:
				p = s.Go(ctx, func(tx *Tx) error {
					return tx.Update(tb, id, func(row []byte) error {
						binary.LittleEndian.PutUint64(row[8:], binary.LittleEndian.Uint64(row[8:])+1)
						return nil
					})
				})
				want[id]++
			}
			ps = append(ps, p)
			if i%2500 == 0 {
				checkIssueOrder(t, ps)
			}
		}
		inFlight := len(ps) - checkIssueOrder(t, ps)
		require.NoError(t, s.Flush(ctx))
		checkIssueOrder(t, ps)
		for i, p := range ps {
			ok, err := resolved(p)
			require.True(t, ok, "Flush returned before pending %d resolved", i)
			if i%1000 == 999 {
				require.ErrorIs(t, err, errOdd)
			} else {
				require.NoError(t, err, "pending %d", i)
			}
			select {
			case <-p.Done():
			default:
				require.Fail(t, "Done not closed after Flush", "pending %d", i)
			}
		}
		for id, w := range want {
			require.NoError(t, tb.Get(ctx, id, buf))
			require.Equal(t, w, binary.LittleEndian.Uint64(buf[8:]), "row %d", id)
		}
		st := db.Stats()
		t.Logf("%d transactions, %d still in flight when the loop ended; %+v", n, inFlight, st)
	})
}

var errInjected = errors.New("injected commit failure")

// failingStore fails every commit batch from the failAt-th on.
type failingStore struct {
	store.Store
	n, failAt atomic.Int64
}

func (s *failingStore) Commit(b *base.Batch, done func(uint64, error)) {
	if s.n.Add(1) >= s.failAt.Load() {
		done(0, errInjected)
		return
	}
	s.Store.Commit(b, done)
}

func TestSessionBatchFailure(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []Durability{Durable, WriteBack} {
		t.Run(map[Durability]string{Durable: "durable", WriteBack: "writeback"}[mode], func(t *testing.T) {
			fs := &failingStore{Store: newLocalStore(t, "")}
			fs.failAt.Store(1 << 40)
			db := openDB(t, ctx, Options{Store: fs, Durability: mode})
			tb, ids := newTableRows(t, ctx, db, "f", 64)
			require.NoError(t, db.pipe.flush(ctx))
			fs.failAt.Store(fs.n.Load() + 3) // the third batch from now fails

			s := db.Session()
			var ps []*Pending
			for i := range 3000 {
				id := ids[i%len(ids)]
				p := s.Go(ctx, func(tx *Tx) error { return tx.Put(tb, id, u64Row(64, uint64(i))) })
				ps = append(ps, p)
				if p.err != nil {
					break // the pipeline stopped: later commits are refused at once
				}
				if i%500 == 499 { // end a batch (at least one): so the third fails mid-run
					if mode == WriteBack {
						_ = db.pipe.flush(ctx) // a flush epoch
					} else {
						_ = p.Wait(ctx)
					}
				}
			}
			err := s.Flush(ctx)
			require.ErrorIs(t, err, errInjected)
			// Outcomes in issue order: successes, then failures only.
			failed := false
			nFailed := 0
			for i, p := range ps {
				err := p.Wait(ctx)
				if failed {
					require.Error(t, err, "pending %d succeeded after a failure", i)
				}
				if err != nil {
					require.ErrorIs(t, err, errInjected, "pending %d", i)
					failed = true
					nFailed++
				}
			}
			require.True(t, failed)
			t.Logf("%d pendings, %d failed", len(ps), nFailed)
			// The node stops committing; waiting on it does not hang.
			require.ErrorIs(t, tb.Put(ctx, ids[0], u64Row(64, 1)), errInjected)
			require.ErrorIs(t, db.Close(ctx), errInjected)
		})
	}
}

// heldCommitStore holds back the acknowledgements of commit batches until release.
type heldCommitStore struct {
	store.Store
	mu       sync.Mutex
	released bool
	acks     []func()
}

func (s *heldCommitStore) Commit(b *base.Batch, done func(uint64, error)) {
	s.Store.Commit(b, func(lsn uint64, err error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.released {
			done(lsn, err)
			return
		}
		s.acks = append(s.acks, func() { done(lsn, err) })
	})
}

func (s *heldCommitStore) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.released = true
	for _, ack := range s.acks {
		ack()
	}
	s.acks = nil
}

// TestPendingContext: a context that ends before the batch is acknowledged leaves the
// outcome unknown (ErrUnknownOutcome); the pending can still be waited for afterwards.
func TestPendingContext(t *testing.T) {
	ctx := context.Background()
	hs := &heldCommitStore{Store: newLocalStore(t, ""), released: true}
	db := openDB(t, ctx, Options{Store: hs})
	defer db.Close(ctx)
	tb, ids := newTableRows(t, ctx, db, "h", 4)
	hs.mu.Lock()
	hs.released = false
	hs.mu.Unlock()

	s := db.Session()
	p := s.Go(ctx, func(tx *Tx) error { return tx.Put(tb, ids[0], u64Row(64, 5)) })
	require.NoError(t, p.err)
	ended, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, p.Wait(ended), ErrUnknownOutcome)
	require.ErrorIs(t, s.Flush(ended), ErrUnknownOutcome)
	// A synchronous commit with a context ended before it is installed: nothing applied.
	err := tb.Put(ended, ids[1], u64Row(64, 6))
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, ErrUnknownOutcome)
	// One whose context ends once it is installed: outcome unknown.
	added := make(chan struct{})
	var once sync.Once
	db.testHookAdded = func(*Tx) { once.Do(func() { close(added) }) }
	pctx, pcancel := context.WithCancel(ctx)
	putErr := make(chan error, 1)
	go func() { putErr <- tb.Put(pctx, ids[1], u64Row(64, 6)) }()
	recvWithin(t, added, "the Put reaching its install")
	pcancel()
	require.ErrorIs(t, recvWithin(t, putErr, "the Put"), ErrUnknownOutcome)
	// Another goroutine reads the committed row: it waits for durability like the writer.
	got := make(chan error, 1)
	go func() {
		buf := make([]byte, 64)
		got <- tb.Get(ctx, ids[1], buf)
	}()
	hs.release()
	require.NoError(t, recvWithin(t, got, "the Get of a row not yet durable"))
	require.NoError(t, p.Wait(ctx))
	require.NoError(t, s.Flush(ctx))
	buf := make([]byte, 64)
	require.NoError(t, tb.Get(ctx, ids[1], buf))
	require.Equal(t, uint64(6), checkRow(t, buf))
}
