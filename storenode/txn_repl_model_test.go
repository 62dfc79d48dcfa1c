package storenode

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
)

// TestReplicatedTxnsAgree runs random two-phase commit calls on the leader of three replicas
// (prepares of a few hot rows, decisions, applies, reports, several in flight at once), with
// partial commits of the log, entries delivered twice, replicas applying at their own pace,
// leader changes, checkpoints and reopens of followers, and requires every replica to end in
// the same state (the rows, parts, locks, decisions, dedup table). WEFT_TXN_REPL_SEED replays
// a seed.
func TestReplicatedTxnsAgree(t *testing.T) {
	seeds := []uint64{1, 2, 3, 4}
	if s := os.Getenv("WEFT_TXN_REPL_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
		seeds = []uint64{seed}
	}
	for _, seed := range seeds {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) { runReplicatedTxnsAgree(t, seed, 300) })
	}
}

func runReplicatedTxnsAgree(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, 0x7e))
	r := newReplTxnGroup(t)
	var calls []chan error
	// call runs fn, a call on the leader, on a goroutine; it returns once fn proposed or
	// returned (refused before proposing), so calls overlap.
	call := func(fn func() error) {
		done := make(chan error, 1)
		go func() { done <- fn() }()
		select {
		case <-r.g.proposed:
		case err := <-done:
			done <- err
		case <-time.After(10 * time.Second): // a bound, not a synchronisation
			t.Fatalf("seed %d: a call neither proposed nor returned", seed)
		}
		calls = append(calls, done)
	}
	ids := 0
	nextSeq := func(e *Engine) uint64 {
		e.mu.Lock()
		defer e.mu.Unlock()
		var last uint64
		if o := e.owners[testOwner]; o != nil {
			last = o.lastSeq
		}
		return max(last, e.repl.seqs[testOwner].seq) + 1
	}
	ctx := context.Background()
	for step := range steps {
		e := r.leader()
		id := txnID(byte(1 + rng.IntN(max(ids, 1))))
		switch k := rng.IntN(12); {
		case k < 3: // a prepare, this node its primary or another
			ids = min(ids+1, 200)
			p := &base.TxnPrepare{Txn: txnID(byte(ids)), Lease: 99, Index: uint16(rng.IntN(2)), Batch: &base.Batch{Owner: testOwner,
				Seq: nextSeq(e), Fences: []base.Fence{{Table: r.table, Epoch: r.epoch}},
				Segments: []base.Segment{oneRow(r.table, uint64(rng.IntN(24)), row64(uint64(step)))}}}
			if rng.IntN(2) == 0 {
				p.Primary = "primary:1"
			}
			call(func() error { _, err := e.PrepareTxn(p); return err })
		case k < 5:
			d, count := base.Decision(1+rng.IntN(2)), 1+rng.IntN(2)
			call(func() error { _, err := e.DecideTxn(ctx, id, 99, d, count); return err })
		case k < 7:
			d := base.Decision(1 + rng.IntN(2))
			call(func() error { return e.ApplyTxn(id, d) })
		case k < 8:
			switch rng.IntN(3) {
			case 0:
				index := uint16(rng.IntN(2))
				call(func() error { return e.ReportTxn(id, index) })
			case 1: // the leader's resolver: asks, applies, reports, forgets, sweeps
				call(func() error { return e.ResolveTxns(ctx) })
			default: // time passes on every replica's clock
				r.clock.Advance(time.Duration(rng.Int64N(int64(DefaultTxnAbortKeep / 2))))
			}
		case k < 10:
			r.g.commit(rng.IntN(8), func() bool { return rng.IntN(8) == 0 })
			for i := range r.g.engines {
				r.g.apply(i, rng.IntN(10))
			}
		case k < 11:
			if rng.IntN(4) == 0 {
				r.g.changeLeader(rng.IntN(len(r.g.engines)))
			} else {
				require.NoError(t, r.g.engines[rng.IntN(len(r.g.engines))].Checkpoint(), "seed %d step %d", seed, step)
			}
		default: // reopen a follower from its checkpoint
			i := rng.IntN(len(r.g.engines))
			if r.g.engines[i] == e {
				continue
			}
			require.NoError(t, r.g.engines[i].Close(), "seed %d step %d", seed, step)
			opts := replOptions(r.g, r.fss[i], i)
			opts.TxnPeer, opts.Now = r.peers, r.clock.Now
			x := openEngine(t, opts)
			t.Cleanup(func() { x.Close() })
			r.g.engines[i] = x
		}
	}
	outcomes := make(map[string]int)
	timeout := time.NewTimer(20 * time.Second) // a bound, not a synchronisation
	defer timeout.Stop()
	for _, done := range calls {
		r.g.drain()
	wait:
		for {
			select {
			case err := <-done: // its outcome is the replicas' business: they must agree on it
				switch {
				case err == nil:
					outcomes["ok"]++
				case errors.Is(err, ErrUnknownOutcome):
					outcomes["unknown"]++
				default:
					outcomes["refused"]++
				}
				break wait
			case <-r.g.proposed: // a resolver's next call
				r.g.drain()
			case <-timeout.C:
				t.Fatalf("seed %d: a call did not return with the log drained", seed)
			}
		}
	}
	r.g.drain()
	parts, decisions := r.g.engines[0].TxnCounts()
	t.Logf("seed %d: calls %v, %d entries, %d parts and %d decisions kept", seed, outcomes, len(r.g.log), parts, decisions)
	r.g.drain()
	for _, x := range r.g.engines {
		require.NoError(t, x.Checkpoint()) // every page map in its meta
	}
	want := sidecarState(captureReplayState(t, r.g.engines[0]))
	for i, x := range r.g.engines[1:] {
		requireSameLines(t, want, sidecarState(captureReplayState(t, x)), "seed "+strconv.FormatUint(seed, 10)+": replica "+strconv.Itoa(i+1))
	}
}
