package txnode

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// countingLeaseClock is a fakeLeaseClock that counts its reads.
type countingLeaseClock struct {
	fakeLeaseClock
	reads atomic.Int64
}

func (c *countingLeaseClock) nanos() int64 {
	c.reads.Add(1)
	return c.fakeLeaseClock.nanos()
}

// TestLeaseReadOncePerTable: a transaction reads the lease clock once per table it touches
// and once per table at commit, not once per row (on 26994d0 a 64-row View read it 64 times);
// and a read-only transaction whose lease ran out after its reads fails at Commit with
// ErrLeaseExpired (on 26994d0 it committed: only the reads checked the lease).
func TestLeaseReadOncePerTable(t *testing.T) {
	ctx := context.Background()
	clock := &countingLeaseClock{}
	db := openHourLeaseDB(t, ctx, 78, clock)
	tb := newTable(t, ctx, db, "l", 64)
	ids := insertRows(t, db, tb, 64)
	buf := make([]byte, 64)

	before := clock.reads.Load()
	require.NoError(t, db.View(ctx, func(tx *Tx) error {
		for _, id := range ids {
			if err := tx.Get(tb, id, buf); err != nil {
				return err
			}
		}
		return nil
	}))
	require.Equal(t, int64(2), clock.reads.Load()-before, "a 64-row View: the first read and the commit")

	before = clock.reads.Load()
	require.NoError(t, db.Update(ctx, func(tx *Tx) error {
		for _, id := range ids {
			if err := tx.Put(tb, id, u64Row(64, id)); err != nil {
				return err
			}
		}
		return nil
	}))
	require.Equal(t, int64(2), clock.reads.Load()-before, "a 64-row update: the first read and the commit")

	// The lease runs out between a writer's reads and its commit.
	tx := openTx(t, ctx, db, true)
	defer tx.Rollback()
	require.NoError(t, tx.Put(tb, ids[0], u64Row(64, 1)))
	clock.n.Add(int64(46 * time.Minute)) // past three quarters of the hour
	require.NoError(t, tx.Put(tb, ids[1], u64Row(64, 1)), "checked at the first touch of the table")
	require.ErrorIs(t, tx.Commit(), ErrLeaseExpired)

	// A closure's own error resting on reads made after the lease ran out is not returned
	// as if it stood (a table adopted now, so its lease is live at the first read).
	q := newTable(t, ctx, db, "q", 64)
	qids := insertRows(t, db, q, 2)
	errMine := errors.New("insufficient funds")
	err := db.Update(ctx, func(tx *Tx) error {
		if err := tx.Get(q, qids[0], buf); err != nil {
			return err
		}
		clock.n.Add(int64(46 * time.Minute))
		if err := tx.Get(q, qids[1], buf); err != nil {
			return err
		}
		return errMine
	})
	require.ErrorIs(t, err, ErrLeaseExpired)

	// And between a read-only transaction's reads and its commit (a table adopted now).
	r := newTable(t, ctx, db, "r", 64)
	rids := insertRows(t, db, r, 2)
	ro := openTx(t, ctx, db, false)
	defer ro.Rollback()
	require.NoError(t, ro.Get(r, rids[0], buf))
	clock.n.Add(int64(46 * time.Minute))
	require.NoError(t, ro.Get(r, rids[1], buf))
	require.ErrorIs(t, ro.Commit(), ErrLeaseExpired)
}
