package txncoord_test

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/txncoord"
)

func row(v uint64) []byte {
	b := make([]byte, 64)
	binary.LittleEndian.PutUint64(b, v)
	return b
}

func open(t *testing.T, ctx context.Context) (*txnode.DB, *txnode.Table) {
	t.Helper()
	db, err := txnode.Open(ctx, txnode.Options{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close(context.Background()) })
	tb, err := db.CreateTable(ctx, "t", 64)
	require.NoError(t, err)
	return db, tb
}

// The typed calls reach txnode's two-phase commit through the bridge: a prepared part keeps
// its info, validates, and commits once decided; a prepare of a read-only or finished Tx is
// refused without a Prepared; a decision sent again to the other outcome is ErrTxnDecided.
func TestPrepareDecideApply(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, tb := open(t, ctx)
	id, err := tb.Insert(ctx, row(1))
	require.NoError(t, err)

	tx, err := db.Begin(ctx, true)
	require.NoError(t, err)
	require.NoError(t, tx.Put(tb, id, row(100)))
	require.NoError(t, txncoord.Validate(tx))
	require.False(t, txncoord.CacheBusy(tx))
	require.NoError(t, txncoord.WaitReads(tx))
	info := txncoord.TxnInfo{ID: [16]byte{7}, Lease: 1, Index: 0}
	p, err := txncoord.Prepare(tx, info)
	require.NoError(t, err)
	require.Equal(t, info, p.Info())
	require.NoError(t, p.Validate())
	_, err = txncoord.Prepare(tx, info)
	require.ErrorIs(t, err, txnode.ErrTxDone, "the Prepared holds the Tx")

	require.NoError(t, txncoord.DecideTxn(ctx, db, info.ID, 1, txncoord.DecisionCommit, 1))
	require.ErrorIs(t, txncoord.DecideTxn(ctx, db, info.ID, 1, txncoord.DecisionAbort, 1), txnode.ErrTxnDecided)
	require.NoError(t, p.Apply(ctx, txncoord.DecisionCommit))
	require.ErrorIs(t, p.Apply(ctx, txncoord.DecisionCommit), txnode.ErrTxDone)
	dst := make([]byte, 64)
	require.NoError(t, tb.Get(ctx, id, dst))
	require.Equal(t, row(100), dst)

	ro, err := db.Begin(ctx, false)
	require.NoError(t, err)
	p, err = txncoord.Prepare(ro, info)
	require.ErrorIs(t, err, txnode.ErrReadOnly)
	require.Nil(t, p)
	require.NoError(t, txncoord.ApplyTxn(ctx, db, [16]byte{8}, txncoord.DecisionAbort))
}

// A durable-read handle reads what the store holds, and tells the table's name, row size
// and layout; held writes refuse commits with ErrMoved until resumed; Serving holds for an
// owned table.
func TestDurableAndHeldWrites(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, tb := open(t, ctx)
	id, err := tb.Insert(ctx, row(5))
	require.NoError(t, err)
	require.NoError(t, db.Flush(ctx))

	d, err := txncoord.OpenDurable(ctx, db, "t")
	require.NoError(t, err)
	require.Same(t, db, d.DB())
	require.Equal(t, "t", d.Name())
	require.Equal(t, 64, d.RowBytes())
	require.Equal(t, base.ClusterLayout{}, d.Cluster())
	dst := make([]byte, 64)
	require.NoError(t, d.Get(ctx, id, dst))
	require.Equal(t, row(5), dst)
	var ids []uint64
	for r, err := range d.ScanAll(ctx) {
		require.NoError(t, err)
		ids = append(ids, r.ID)
	}
	require.Equal(t, []uint64{id}, ids)
	_, err = txncoord.OpenDurable(ctx, db, "nope")
	require.ErrorIs(t, err, txnode.ErrTableNotFound)

	require.NoError(t, txncoord.Serving(tb))
	require.False(t, txncoord.WritesHeld(tb))
	require.NoError(t, txncoord.FlushHeld(ctx, tb))
	require.True(t, txncoord.WritesHeld(tb))
	require.ErrorIs(t, tb.Put(ctx, id, row(6)), txnode.ErrMoved)
	txncoord.ResumeWrites(tb)
	require.False(t, txncoord.WritesHeld(tb))
	require.NoError(t, tb.Put(ctx, id, row(6)))
	txncoord.HoldWrites(tb)
	require.True(t, txncoord.WritesHeld(tb))
}

// A CacheTurn refuses a transaction that was not sent back, and Release of an unused one is
// a no-op.
func TestCacheTurnNotBusy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, _ := open(t, ctx)
	tx, err := db.Begin(ctx, true)
	require.NoError(t, err)
	defer tx.Rollback()
	var c txncoord.CacheTurn
	require.Error(t, c.Wait(tx))
	c.Hold(tx)
	c.Release()
}

// A superseded table validates no read: a transaction that read it fails its commit with
// ErrConflict, read-only or writing another table, and so does a prepared part's Validate;
// one begun after reads it as before and fails too (the mark is for good).
func TestSupersededTableValidatesNoRead(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, tb := open(t, ctx)
	other, err := db.CreateTable(ctx, "other", 64)
	require.NoError(t, err)
	id, err := tb.Insert(ctx, row(1))
	require.NoError(t, err)
	oid, err := other.Insert(ctx, row(2))
	require.NoError(t, err)
	pid, err := other.Insert(ctx, row(2)) // the prepared part's (its rows stay locked)
	require.NoError(t, err)
	dst := make([]byte, 64)

	view, err := db.Begin(ctx, false)
	require.NoError(t, err)
	require.NoError(t, view.Get(tb, id, dst))
	write, err := db.Begin(ctx, true)
	require.NoError(t, err)
	require.NoError(t, write.Get(tb, id, dst))
	require.NoError(t, write.Put(other, oid, row(3)))
	part, err := db.Begin(ctx, true)
	require.NoError(t, err)
	require.NoError(t, part.Get(tb, id, dst))
	require.NoError(t, part.Put(other, pid, row(4)))
	p, err := txncoord.Prepare(part, txncoord.TxnInfo{ID: [16]byte{9}, Lease: 1})
	require.NoError(t, err)

	same, err := db.Table(ctx, "t")
	require.NoError(t, err)
	require.True(t, txncoord.Same(tb, same), "two handles of one table")
	require.False(t, txncoord.Same(tb, other))
	require.False(t, txncoord.Supersede(tb, same), "a handle of its own state is no successor")
	require.NoError(t, txncoord.Validate(view), "not marked")
	require.True(t, txncoord.Supersede(tb, nil))
	require.ErrorIs(t, view.Commit(), txnode.ErrConflict)
	require.ErrorIs(t, write.Commit(), txnode.ErrConflict)
	require.ErrorIs(t, p.Validate(), txnode.ErrConflict)
	require.NoError(t, p.Apply(ctx, txncoord.DecisionAbort))
	for _, r := range []uint64{oid, pid} {
		require.NoError(t, other.Get(ctx, r, dst))
		require.Equal(t, row(2), dst, "nothing of the writes committed")
	}

	again, err := db.Begin(ctx, false)
	require.NoError(t, err)
	require.NoError(t, again.Get(tb, id, dst))
	require.ErrorIs(t, again.Commit(), txnode.ErrConflict, "superseded for good")
	untouched, err := db.Begin(ctx, true)
	require.NoError(t, err)
	require.NoError(t, untouched.Put(other, oid, row(5)))
	require.NoError(t, untouched.Commit(), "a transaction that did not touch it commits")
}
