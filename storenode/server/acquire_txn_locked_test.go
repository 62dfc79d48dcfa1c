package server

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/sgio"
)

// TestAcquireCostNotScaledByOthersPreparedParts: an Acquire of a table the session's owner
// does not hold first asks tableLocked whether a prepared part writes the table, and
// tableLocked walks every segment of every prepared part under the engine lock (before the
// live-holder check, so an Acquire that is then refused with ErrTableOwned pays it too). A
// client prepares, within its own per-owner bounds (16 MiB of prepare records), parts of
// clear-only segments (32 bytes each: ~500K segments) naming an unreachable primary, then
// sends Acquires of another owner's live table, pipelined: each is refused, and each holds
// the engine lock for the whole walk, so the other owner's commits wait behind them. (With
// made-up owner ids, TestTxnOwnerQuotaNotBypassedByOwnerIDs, the walk is up to MaxTxnBytes:
// 16 times longer.)
//
// What should happen: an Acquire costs O(1) (or O(the table's locked pages)) under the
// engine lock, whatever other owners hold prepared: a per-table count of locked rows, say;
// the victim's 20 commits stay fast (45 ms in all without the prepared parts, on the 2-core
// development machine; the bound asserted is 500 ms). Fails on d707e6a: they take 1.3-4 s (the
// worst ~0.5 s; 1 ms without the parts).
func TestAcquireCostNotScaledByOthersPreparedParts(t *testing.T) {
	env := startServer(t, func(cfg *Config) { cfg.Options.LeaseChecker = &txnLeases{} })
	ctx := srvCtx(t)
	const attacker = testOwner + 100
	c := env.dial(attacker)
	ti, g := srvTable(t, c, "mine", attacker)
	const segs, parts = 1<<16 - 1, 7
	for pages := 4096; pages <= segs*parts+4096; pages += 4096 {
		require.NoError(t, srvGrant(ctx, c, ti.Table, attacker, g.Epoch, pages))
	}
	seq := g.LastSeq
	for p := range parts {
		seq++
		m := &sgio.Commit{Owner: attacker, Seq: seq, Fences: []sgio.Fence{{Table: ti.Table, Epoch: g.Epoch}}}
		for i := range segs {
			m.Segments = append(m.Segments, sgio.Segment{Table: ti.Table, RowBytes: 64, Page: uint64(p*segs + i), Clear: 1})
		}
		_, err := c.PrepareTxn(ctx, &sgio.TxnPrepare{Txn: [16]byte{0x5c, byte(p)}, Lease: 99, Index: 1, Primary: "127.0.0.1:1", Commit: *m})
		require.NoError(t, err)
	}

	v := env.dial(testOwner)
	vt, vg := srvTable(t, v, "bank", testOwner)
	o := env.dial(testOwner + 1)
	flood, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for flood.Err() == nil {
				err := o.CallInto(flood, &sgio.Acquire{Table: vt.Table, Owner: testOwner + 1}, &sgio.Grant{})
				if err == nil {
					return // granted: not the attack this test makes
				}
			}
		}()
	}
	vseq := vg.LastSeq
	t0 := time.Now()
	for range 20 {
		vseq++
		require.NoError(t, v.CallInto(ctx, srvCommit(vt.Table, testOwner, vg.Epoch, vseq, []uint64{1}, vseq), &sgio.CommitAck{}))
	}
	took := time.Since(t0)
	cancel()
	wg.Wait()
	require.Less(t, took, 500*time.Millisecond, "another owner's 20 commits wait behind the Acquires' walks of the prepared parts")
}
