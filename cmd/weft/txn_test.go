package main

import (
	"context"
	"encoding/hex"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testclock"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
)

// TestTxnListAndAbort: `weft txn list` prints a part prepared and never decided once it is
// in doubt (owner, table, age, primary), and `weft txn abort TXN` aborts it: the table can
// be dropped again. Before TxnInDoubtAfter the list is empty and the abort refused. Fails on
// b3f6c9d: no txn command.
func TestTxnListAndAbort(t *testing.T) {
	ctx := context.Background()
	clock := &testclock.Fake{}
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0",
		Options: storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, Now: clock.Now, TxnResolveInterval: -1}})
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	defer srv.Shutdown(ctx)
	addr := srv.Addr().String()
	e := srv.Engine()
	ti, err := e.CreateTable("bank", 64)
	require.NoError(t, err)
	g, err := e.Acquire(ti.ID, 7, 0)
	require.NoError(t, err)
	_, _, err = e.AllocIDs(ti.ID, 7, g.Epoch, 1)
	require.NoError(t, err)
	id := base.TxnID{0x7e, 15: 1}
	_, err = e.PrepareTxn(&base.TxnPrepare{Txn: id, Lease: 9, Primary: "lost.example:7070", Index: 1,
		Batch: &base.Batch{Owner: 7, Seq: g.LastSeq + 1, Fences: []base.Fence{{Table: ti.ID, Epoch: g.Epoch}},
			Segments: []base.Segment{{Table: ti.ID, Page: 0, Data: 1, Rows: make([]byte, 64)}}}})
	require.NoError(t, err)
	require.NoError(t, e.Release(ti.ID, 7, g.Epoch))
	txn := hex.EncodeToString(id[:])

	code, out, errOut := weft(t, "--store", addr, "txn", "list")
	require.Zero(t, code, errOut)
	require.NotContains(t, out, txn, "not in doubt yet")
	code, _, errOut = weft(t, "--store", addr, "txn", "abort", txn)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "not in doubt")

	clock.Advance(storenode.DefaultTxnInDoubtAfter + time.Second)
	code, out, errOut = weft(t, "--store", addr, "txn", "list")
	require.Zero(t, code, errOut)
	require.Regexp(t, `(?m)^`+txn+`\s+7\s+`+strconv.Itoa(int(ti.ID))+`\s+5m1s\s+lost.example:7070\s+9$`, out)
	require.ErrorIs(t, e.DropTable("bank", 8), storenode.ErrTxnLocked, "locked by the part in doubt")

	code, out, errOut = weft(t, "--store", addr, "txn", "abort", txn)
	require.Zero(t, code, errOut)
	require.Contains(t, out, "aborted "+txn)
	code, out, errOut = weft(t, "--store", addr, "txn", "list")
	require.Zero(t, code, errOut)
	require.NotContains(t, out, txn)
	require.NoError(t, e.DropTable("bank", 8), "unlocked")

	code, _, _ = weft(t, "--store", addr, "txn", "abort", "xyz")
	require.Equal(t, 2, code, "a bad id is bad usage")
	code, _, _ = weft(t, "--store", addr, "txn")
	require.Equal(t, 2, code)
}
