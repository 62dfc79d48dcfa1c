package storenode

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// RenewGrant takes no engine lock: it renews while mu is held (by a checkpoint, a stall of
// commits), and it follows the fencing rules of a renewal: the current grant renews (and
// reports the owner's last applied seq), a stale epoch is ErrFenced, a missing table
// ErrTableNotFound, a released identity ErrFenced.
func TestRenewGrantWithoutEngineLock(t *testing.T) {
	now := fakeClock{}
	e := openTest(t, Options{Now: now.Now})
	info, g := ownedTable(t, e, "t", 64, 1, 1)
	commitWait(t, e, &base.Batch{Owner: 1, Seq: 1, Fences: []base.Fence{{Table: info.ID, Epoch: g.Epoch}}, Segments: []base.Segment{oneRow(info.ID, 1, row64(1))}})

	e.mu.Lock()
	done := make(chan error, 1)
	go func() {
		for range 3 {
			now.Advance(DefaultLeaseDuration / 2)
			r, err := e.RenewGrant(info.ID, 1, g.Epoch)
			if err == nil && (r.Epoch != g.Epoch || r.LastSeq != 1 || r.Lease != DefaultLeaseDuration) {
				t.Errorf("renewal granted %+v", r)
			}
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("RenewGrant waited for the engine's lock")
	}
	e.mu.Unlock()
	// Past the original lease, renewed: another owner is refused.
	_, err := e.Acquire(info.ID, 2, 0)
	require.ErrorIs(t, err, ErrTableOwned)

	_, err = e.RenewGrant(info.ID, 1, g.Epoch+1)
	require.ErrorIs(t, err, ErrFenced)
	_, err = e.RenewGrant(info.ID+9, 1, g.Epoch)
	require.ErrorIs(t, err, ErrTableNotFound)
	_, err = e.RenewGrant(info.ID, 1, 0)
	require.ErrorIs(t, err, ErrMalformed)

	// Lapsed and granted to another owner: the old grant is fenced, and stays so.
	now.Advance(DefaultLeaseDuration + 1)
	g2 := acquire(t, e, info.ID, 2, 0)
	_, err = e.RenewGrant(info.ID, 1, g.Epoch)
	require.ErrorIs(t, err, ErrFenced)
	_, err = e.RenewGrant(info.ID, 2, g2.Epoch)
	require.NoError(t, err)

	// A released identity renews nothing.
	require.NoError(t, e.Connect(2, Incarnation{2}, 77, func() {}))
	require.NoError(t, e.ReleaseOwner(2, 77))
	_, err = e.RenewGrant(info.ID, 2, g2.Epoch)
	require.ErrorIs(t, err, ErrFenced)

	// Dropped: gone (owner 1's identity was never released).
	require.NoError(t, e.DropTable("t", 2))
	_, err = e.RenewGrant(info.ID, 1, g.Epoch)
	require.ErrorIs(t, err, ErrTableNotFound)
}

// A renewal racing a new grant to another owner once the lease lapsed never leaves both
// believing they hold the table: either the renewal came first (then the grant is refused,
// the lease being live again) or the grant did (then the renewal is fenced). Run with -race.
func TestRenewGrantRacesNewGrant(t *testing.T) {
	rounds := 200
	if testing.Short() {
		rounds = 50
	}
	now := fakeClock{}
	e := openTest(t, Options{Now: now.Now})
	info, err := e.CreateTable("t", 64)
	require.NoError(t, err)
	holder := uint64(1)
	g := acquire(t, e, info.ID, holder, 0)
	for range rounds {
		now.Advance(DefaultLeaseDuration + 1) // lapsed
		other := 3 - holder
		var wg sync.WaitGroup
		var renewErr, grantErr error
		var g2 base.Grant
		wg.Add(2)
		go func() { defer wg.Done(); _, renewErr = e.RenewGrant(info.ID, holder, g.Epoch) }()
		go func() { defer wg.Done(); g2, grantErr = e.Acquire(info.ID, other, 0) }()
		wg.Wait()
		switch {
		case renewErr == nil:
			require.ErrorIs(t, grantErr, ErrTableOwned, "renewed and granted to another owner at once")
		default:
			require.ErrorIs(t, renewErr, ErrFenced)
			require.NoError(t, grantErr)
			holder, g = other, g2
		}
	}
}

// After Close every call fails with ErrClosed (errors.go), renewals included: a closed engine
// renews no lease (its holder must not be told it may keep serving), whether asked through
// RenewGrant or Acquire with the grant's epoch; Renew extends nothing.
func TestRenewGrantAfterClose(t *testing.T) {
	now := fakeClock{}
	e := openTest(t, Options{Now: now.Now})
	info, err := e.CreateTable("t", 64)
	require.NoError(t, err)
	g := acquire(t, e, info.ID, 1, 0)
	require.NoError(t, e.Close())

	_, err = e.RenewGrant(info.ID, 1, g.Epoch)
	require.ErrorIs(t, err, ErrClosed)
	_, err = e.Acquire(info.ID, 1, g.Epoch)
	require.ErrorIs(t, err, ErrClosed)

	now.Advance(DefaultLeaseDuration / 2)
	e.Renew(1)
	e.leaseMu.Lock()
	until := e.tables[info.ID].leaseUntil
	e.leaseMu.Unlock()
	require.False(t, until.After(now.Now().Add(DefaultLeaseDuration/2)), "Renew extended a lease of a closed engine")
}
