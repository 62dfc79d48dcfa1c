package storenode

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/vfs"
)

// The storage node served rows not durable yet to any reader with the holder's owner id. A
// transaction node restarted with the same owner id (a new incarnation, after a lease of
// silence) is not the writer of the old incarnation's rows in flight: until it is granted the
// table itself it is served only durable rows, as any other reader (the page's fsync is
// waited for; after a failed one it gets the failure). The holder incarnation reads its own
// write at once. Fails on 964dade: the new incarnation got the row while its fsync was
// blocked (holdership was decided by owner id alone).
func TestNewIncarnationReadsDurableOnly(t *testing.T) {
	for _, fail := range []bool{false, true} {
		name := map[bool]string{false: "sync-ok", true: "sync-fails"}[fail]
		t.Run(name, func(t *testing.T) {
			var clock fakeClock
			fs := vfs.NewFaultFS()
			e := openEngine(t, Options{Dir: "db", FS: fs, Logger: quietLogger, CheckpointInterval: -1, Now: clock.Now})
			t.Cleanup(func() { e.Close() })
			info, err := e.CreateTable("t", 64)
			require.NoError(t, err)
			incA, incB := Incarnation{0xa}, Incarnation{0xb}
			require.NoError(t, e.Connect(testOwner, incA, 1, func() {}))
			g := acquire(t, e, info.ID, testOwner, 0)
			requireGranted(t, e, info.ID, testOwner, g.Epoch)

			block := newBlockSyncs(fs)
			released := false
			t.Cleanup(func() { // before Close, which waits for the blocked fsync
				if !released {
					block.release(true)
				}
			})
			commit := commitAsync(e, batchOf(testOwner, 1, info.ID, g.Epoch, oneRow(info.ID, 70, row64(70))))
			block.waitBlocked(t)
			data, _, _, err := e.ReadRowsAs(testOwner, info.ID, 1, 1<<6, nil)
			require.NoError(t, err)
			require.Equal(t, uint64(1<<6), data, "the holder incarnation reads its own write at once")

			// A dies; after a lease of silence a new incarnation claims the owner id.
			e.Disconnect(testOwner, 1)
			clock.Advance(e.LeaseDuration())
			require.NoError(t, e.Connect(testOwner, incB, 2, func() {}))

			rows := readRowAsync(e, testOwner, info.ID)
			waitDurableWaiter(t, e, func() bool { return len(rows) > 0 })
			require.Empty(t, rows, "the new incarnation was served a row not durable yet")
			dir := pageDirAsync(e, testOwner, info.ID)
			released = true
			block.release(fail)
			if !heldReadsDone(t, fail, commit, rows, dir) {
				return
			}

			// Granted the table (a new epoch), the new incarnation is its holder.
			g2 := acquire(t, e, info.ID, testOwner, 0)
			require.True(t, e.holderReadsNow(info.ID, testOwner), "epoch %d", g2.Epoch)
		})
	}
}

// holderReadsNow is holderReads of table id for reader.
func (e *Engine) holderReadsNow(id uint32, reader uint64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.holderReads(e.tables[id], reader)
}

// holderOnConnection opens an engine on a fake clock with one table granted to testOwner
// through connection 1 of incarnation A; it returns incarnation B, A's successor.
func holderOnConnection(t *testing.T) (*Engine, *fakeClock, base.TableInfo, base.Grant, Incarnation) {
	t.Helper()
	clock := new(fakeClock)
	e := openTest(t, Options{Dir: t.TempDir(), Sync: SyncNone, Now: clock.Now})
	info, err := e.CreateTable("t", 64)
	require.NoError(t, err)
	incA, incB := Incarnation{0xa}, Incarnation{0xb}
	require.NoError(t, e.Connect(testOwner, incA, 1, func() {}))
	g := acquire(t, e, info.ID, testOwner, 0)
	return e, clock, info, g, incB
}

// A renewal from a connection checks that it still holds the owner id under the renewal's own
// lock (RenewGrantFrom): a replaced connection's late renewal is ErrIdentityLost, not a
// renewal that would make the new holder of the id the table's holder incarnation; the
// holding connection's renewal makes its incarnation the holder's.
func TestRenewalFromReplacedConnection(t *testing.T) {
	e, clock, info, g, incB := holderOnConnection(t)
	require.True(t, e.holderReadsNow(info.ID, testOwner))

	clock.Advance(e.LeaseDuration())
	require.NoError(t, e.Connect(testOwner, incB, 2, func() {}))
	require.False(t, e.holderReadsNow(info.ID, testOwner), "B was not granted the table")
	_, err := e.RenewGrantFrom(info.ID, testOwner, g.Epoch, 1)
	require.ErrorIs(t, err, ErrIdentityLost, "A's connection was replaced")
	require.NotErrorIs(t, err, ErrFenced)
	require.False(t, e.holderReadsNow(info.ID, testOwner), "A's late renewal does not make B the holder")
	_, err = e.RenewGrantFrom(info.ID, testOwner, g.Epoch, 2)
	require.NoError(t, err)
	require.True(t, e.holderReadsNow(info.ID, testOwner), "a renewal proves the grant: B reads as the holder")
}

// A grant or an etcd registration for a connection checks that it still holds the owner id
// together with reading the incarnation the grant installs (AcquireFrom, RegisterGrantFrom):
// a new grant's etcd verification may wait, and a restarted transaction node (another
// incarnation, after a lease of silence) may claim the id meanwhile; the old connection's
// grant must not make the new incarnation the table's holder incarnation, which would read
// rows not durable yet that it did not write. bc2d8a2 checked the connection only in the
// session, before the wait, and installed whichever incarnation held the id afterwards (with
// identIncFrom's check removed this test fails: B reads as the holder).
func TestGrantFromReplacedConnection(t *testing.T) {
	var clock fakeClock
	v := newMemVerifier()
	e := openTest(t, Options{Dir: t.TempDir(), Sync: SyncNone, Now: clock.Now, GrantVerifier: v})
	local, err := e.CreateTable("t", 64)
	require.NoError(t, err)
	ti, err := e.CreateClusterTable(base.PartitionTableName("acct", 1), 64, testLayout)
	require.NoError(t, err)
	incA, incB := Incarnation{0xa}, Incarnation{0xb}
	require.NoError(t, e.Connect(testOwner, incA, 1, func() {}))
	epoch := v.grant("acct", 1, testOwner)

	v.mu.Lock()
	v.block = make(chan struct{})
	v.mu.Unlock()
	reg := make(chan error, 1)
	go func() {
		_, err := e.RegisterGrantFrom(context.Background(), ti.ID, testOwner, epoch, 1)
		reg <- err
	}()
	require.Eventually(t, func() bool { v.mu.Lock(); defer v.mu.Unlock(); return v.calls > 0 }, 10*time.Second, time.Millisecond)
	clock.Advance(e.LeaseDuration())
	require.NoError(t, e.Connect(testOwner, incB, 2, func() {})) // B claims the id during the verification
	v.mu.Lock()
	close(v.block)
	v.block = nil
	v.mu.Unlock()
	err = <-reg
	require.ErrorIs(t, err, ErrIdentityLost, "A's connection was replaced during the verification")
	require.False(t, e.holderReadsNow(ti.ID, testOwner), "A's late registration made B the holder incarnation")
	_, err = e.AcquireFrom(local.ID, testOwner, 0, 1)
	require.ErrorIs(t, err, ErrIdentityLost)
	require.NotErrorIs(t, err, ErrFenced)
	require.False(t, e.holderReadsNow(local.ID, testOwner))

	// B's own grants make it the holder incarnation.
	_, err = e.RegisterGrantFrom(context.Background(), ti.ID, testOwner, epoch, 2)
	require.NoError(t, err)
	require.True(t, e.holderReadsNow(ti.ID, testOwner))
	_, err = e.AcquireFrom(local.ID, testOwner, 0, 2)
	require.NoError(t, err)
	require.True(t, e.holderReadsNow(local.ID, testOwner))
}

// A connection replaced by another incarnation's claim does not get the owner id back when
// that later connection closes too: HoldsIdent of a closed holder's identity accepted any
// connection (the holder's was forgotten), so the replaced connection's late requests, still
// queued in its session, acted as the owner again: its renewal made the new incarnation the
// table's holder incarnation (reading rows not durable yet it did not write), and its late
// commits passed the session's identity check. Only the connection that closed itself
// keeps acting for its queued requests. Fails on bc2d8a2: after B's connection closed, A's
// connection held the id again and its renewal made B the holder incarnation.
func TestReplacedConnectionStaysReplacedAfterNextCloses(t *testing.T) {
	e, clock, info, g, incB := holderOnConnection(t)

	clock.Advance(e.LeaseDuration())
	require.NoError(t, e.Connect(testOwner, incB, 2, func() {}))
	e.Disconnect(testOwner, 2) // B's connection closes; A's is still on its way out
	require.True(t, e.HoldsIdent(testOwner, 2), "the closed connection's queued requests still act")
	require.False(t, e.HoldsIdent(testOwner, 1), "A's connection was replaced")
	_, err := e.RenewGrantFrom(info.ID, testOwner, g.Epoch, 1)
	require.ErrorIs(t, err, ErrIdentityLost)
	require.False(t, e.holderReadsNow(info.ID, testOwner), "A's late renewal made B the holder incarnation")
	_, err = e.AcquireFrom(info.ID, testOwner, 0, 1)
	require.ErrorIs(t, err, ErrIdentityLost)

	// B reconnects (the same incarnation): its new connection holds the id.
	require.NoError(t, e.Connect(testOwner, incB, 3, func() {}))
	require.True(t, e.HoldsIdent(testOwner, 3))
	require.False(t, e.HoldsIdent(testOwner, 2))
	_, err = e.RenewGrantFrom(info.ID, testOwner, g.Epoch, 3)
	require.NoError(t, err)
	require.True(t, e.holderReadsNow(info.ID, testOwner))
}
