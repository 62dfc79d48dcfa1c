package storenode

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testseed"
)

// memVerifier is an in-memory GrantVerifier: owner keys by (table, partition), each with its
// owner and creation revision, and a revision counter, as etcd keeps them. Package cluster's
// tests run the real one against etcd.
type memVerifier struct {
	mu    sync.Mutex
	rev   uint64
	keys  map[string][2]uint64 // "table/p" -> owner, revision
	err   error                // returned by every call while set (etcd unreachable)
	block chan struct{}        // VerifyGrant waits for it to close while set
	calls int
}

func newMemVerifier() *memVerifier { return &memVerifier{rev: 100, keys: map[string][2]uint64{}} }

// grant creates the owner key of (table, p) for owner and returns its revision.
func (v *memVerifier) grant(table string, p uint32, owner uint64) uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.rev++
	v.keys[fmt.Sprintf("%s/%d", table, p)] = [2]uint64{owner, v.rev}
	return v.rev
}

func (v *memVerifier) VerifyGrant(ctx context.Context, table string, p uint32, owner, epoch uint64) error {
	v.mu.Lock()
	v.calls++
	block, err := v.block, v.err
	k, ok := v.keys[fmt.Sprintf("%s/%d", table, p)]
	v.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	switch {
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("no owner key: %w", ErrFenced)
	case k[0] != owner || k[1] != epoch:
		return fmt.Errorf("owner key of owner %d revision %d: %w", k[0], k[1], ErrFenced)
	}
	return nil
}

func (v *memVerifier) Revision(ctx context.Context) (uint64, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.err != nil {
		return 0, v.err
	}
	return v.rev, nil
}

var testLayout = base.ClusterLayout{Partitions: 3, StripePages: 2, Partition: 1}

func TestClusterTableIDsAndKinds(t *testing.T) {
	v := newMemVerifier()
	dir := t.TempDir()
	e := openTest(t, Options{Dir: dir, GrantVerifier: v})
	_, err := e.CreateClusterTable("acct", 64, testLayout)
	require.ErrorIs(t, err, ErrBadName, "the name must be the partition's")
	_, err = e.CreateClusterTable(base.PartitionTableName("acct", 1), 64, base.ClusterLayout{Partitions: 3, StripePages: 2, Partition: 3})
	require.ErrorIs(t, err, ErrMalformed)
	ti, err := e.CreateClusterTable(base.PartitionTableName("acct", 1), 64, testLayout)
	require.NoError(t, err)
	require.Equal(t, testLayout, ti.Cluster)
	require.EqualValues(t, 128, ti.NextID, "the partition's first id")
	local, err := e.CreateTable("local", 64)
	require.NoError(t, err)

	// Local-counter grants of a cluster table, etcd grants of a local table: refused.
	_, err = e.Acquire(ti.ID, testOwner, 0)
	require.ErrorIs(t, err, ErrGrantKind)
	_, err = e.RenewGrant(ti.ID, testOwner, 5)
	require.ErrorIs(t, err, ErrGrantKind)
	_, err = e.RegisterGrant(context.Background(), local.ID, testOwner, 5)
	require.ErrorIs(t, err, ErrGrantKind)

	epoch := v.grant("acct", 1, testOwner)
	g, err := e.RegisterGrant(context.Background(), ti.ID, testOwner, epoch)
	require.NoError(t, err)
	require.Equal(t, epoch, g.Epoch)
	require.Zero(t, g.Lease, "etcd decides when a cluster grant ends")

	// Ids of partition 1's stripes only (stripes of 128 ids, rounds of 384), a stripe at a time.
	var got [][2]uint64
	for range 4 {
		first, count, err := e.AllocIDs(ti.ID, testOwner, epoch, 3)
		require.NoError(t, err)
		got = append(got, [2]uint64{first, count})
		for id := first; id < first+count; id++ {
			require.Equal(t, uint32(1), testLayout.PartitionOf(id), "id %d", id)
		}
	}
	require.Equal(t, [][2]uint64{{128, 128}, {512, 128}, {896, 128}, {1280, 128}}, got)
	// A commit to a page of another partition is refused even below the next id.
	_, err = e.CommitWait(&base.Batch{Owner: testOwner, Seq: 1, Fences: []base.Fence{{Table: ti.ID, Epoch: epoch}},
		Segments: []base.Segment{oneRow(ti.ID, 300, row64(1))}})
	require.ErrorIs(t, err, ErrMalformed)
	commitWait(t, e, &base.Batch{Owner: testOwner, Seq: 1, Fences: []base.Fence{{Table: ti.ID, Epoch: epoch}},
		Segments: []base.Segment{oneRow(ti.ID, 520, row64(1))}})

	// Restart twice: from the WAL (no checkpoint: the create record of kind 7), then from the
	// meta file (version 5); the layout, the ids and the grant stay.
	for round := range 2 {
		e.crashForTest()
		require.Empty(t, damages(runCheck(t, dir)), "round %d: Check reads cluster tables", round)
		e = openTest(t, Options{Dir: dir, GrantVerifier: v})
		ts := e.Tables()
		require.Len(t, ts, 2, "round %d", round)
		require.Equal(t, testLayout, ts[0].Cluster)
		require.False(t, ts[1].Cluster.IsCluster())
		first, _, err := e.AllocIDs(ti.ID, testOwner, epoch, 1)
		require.NoError(t, err, "round %d: the grant survives a restart: etcd decides when it ends", round)
		require.Equal(t, uint32(1), testLayout.PartitionOf(first))
		row, ok := readRow(t, e, ti.ID, 520)
		require.True(t, ok)
		require.Equal(t, row64(1), row)
		require.NoError(t, e.Checkpoint())
		m, _, err := loadMeta(e.fs, dir)
		require.NoError(t, err)
		require.EqualValues(t, metaVersionCluster, m.version)
	}
}

// crashForTest closes e without the final checkpoint, as after a crash.
func (e *Engine) crashForTest() {
	e.mu.Lock()
	e.closed = true
	e.shut.Store(true)
	e.cond.Broadcast()
	e.mu.Unlock()
	close(e.stop)
	e.bg.Wait()
	e.releaseAllBackups()
	e.log.Close()
	e.closeFiles()
}

func TestClusterRegisterGrantFencing(t *testing.T) {
	v := newMemVerifier()
	dir := t.TempDir()
	e := openTest(t, Options{Dir: dir, GrantVerifier: v})
	ti, err := e.CreateClusterTable(base.PartitionTableName("acct", 1), 64, testLayout)
	require.NoError(t, err)
	ctx := context.Background()
	const a, b = 11, 22

	// Without a verifier: refused.
	noV := openTest(t, Options{})
	ti2, err := noV.CreateClusterTable(base.PartitionTableName("x", 0), 64, base.ClusterLayout{Partitions: 1, StripePages: 1})
	require.NoError(t, err)
	_, err = noV.RegisterGrant(ctx, ti2.ID, a, 7)
	require.ErrorIs(t, err, ErrNoVerifier)

	ea := v.grant("acct", 1, a)
	// Forged: the right epoch for another owner, another epoch for the right owner.
	_, err = e.RegisterGrant(ctx, ti.ID, b, ea)
	require.ErrorIs(t, err, ErrFenced)
	_, err = e.RegisterGrant(ctx, ti.ID, a, ea+1)
	require.ErrorIs(t, err, ErrFenced)
	// etcd unreachable: unverified, nothing changed.
	v.mu.Lock()
	v.err = errors.New("etcd down")
	v.mu.Unlock()
	_, err = e.RegisterGrant(ctx, ti.ID, a, ea)
	require.ErrorIs(t, err, ErrGrantUnverified)
	v.mu.Lock()
	v.err = nil
	v.mu.Unlock()
	_, err = e.RegisterGrant(ctx, ti.ID, a, ea)
	require.NoError(t, err)
	calls := v.calls
	_, err = e.RegisterGrant(ctx, ti.ID, a, ea)
	require.NoError(t, err, "a renewal of the current grant")
	require.Equal(t, calls, v.calls, "a renewal reads no etcd")
	_, _, err = e.AllocIDs(ti.ID, a, ea, 1)
	require.NoError(t, err)

	// Another owner takes over: a is fenced.
	eb := v.grant("acct", 1, b)
	_, err = e.RegisterGrant(ctx, ti.ID, b, eb)
	require.NoError(t, err)
	_, _, err = e.AllocIDs(ti.ID, a, ea, 1)
	require.ErrorIs(t, err, ErrFenced)
	_, err = e.CommitWait(&base.Batch{Owner: a, Seq: 1, Fences: []base.Fence{{Table: ti.ID, Epoch: ea}},
		Segments: []base.Segment{oneRow(ti.ID, 130, row64(1))}})
	require.ErrorIs(t, err, ErrFenced)

	st := e.Stats()
	require.Equal(t, [3]uint64{2, 2, 1}, [3]uint64{st.GrantsRegistered, st.GrantsRefused, st.GrantsUnverified},
		"registered, refused, unverified")

	// The floor persists across a restart: a's old grant, even re-verifiable (etcd handed
	// the key back to a at that revision in this model), is below it.
	e.crashForTest()
	e = openTest(t, Options{Dir: dir, GrantVerifier: v})
	v.mu.Lock()
	v.keys["acct/1"] = [2]uint64{a, ea}
	v.mu.Unlock()
	calls = v.calls
	_, err = e.RegisterGrant(ctx, ti.ID, a, ea)
	require.ErrorIs(t, err, ErrFenced)
	require.Equal(t, calls, v.calls, "a grant below the floor is refused without reading etcd")
	// b's grant is still current after the restart: no lease timer applies.
	_, err = e.RegisterGrant(ctx, ti.ID, b, eb)
	require.NoError(t, err)
}

// A verification waiting for etcd holds no engine lock: commits to other tables, reads and
// checkpoints go on; its context bounds it.
func TestClusterVerifyHoldsNoLock(t *testing.T) {
	v := newMemVerifier()
	e := openTest(t, Options{GrantVerifier: v, GrantVerifyTimeout: time.Minute})
	ti, err := e.CreateClusterTable(base.PartitionTableName("acct", 0), 64, base.ClusterLayout{Partitions: 1, StripePages: 1})
	require.NoError(t, err)
	local, g := ownedTable(t, e, "local", 64, testOwner, 1)
	block := make(chan struct{})
	v.mu.Lock()
	v.block = block
	v.mu.Unlock()
	epoch := v.grant("acct", 0, 9)
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, err := e.RegisterGrant(ctx, ti.ID, 9, epoch)
		done <- err
	}()
	commitWait(t, e, &base.Batch{Owner: testOwner, Seq: 1, Fences: []base.Fence{{Table: local.ID, Epoch: g.Epoch}},
		Segments: []base.Segment{oneRow(local.ID, 1, row64(1))}})
	require.NoError(t, e.Checkpoint())
	cancel()
	err = <-done
	require.ErrorIs(t, err, ErrGrantUnverified)
	require.ErrorIs(t, err, context.Canceled)
	close(block)
	_, err = e.RegisterGrant(context.Background(), ti.ID, 9, epoch)
	require.NoError(t, err)
}

// A restored copy's cluster tables raise their floor to etcd's revision (no 2^32 bump; local
// tables keep the bump); without etcd the first open fails and the marker stays.
func TestClusterRestoreFloor(t *testing.T) {
	v := newMemVerifier()
	e := openTest(t, Options{GrantVerifier: v})
	ti, err := e.CreateClusterTable(base.PartitionTableName("acct", 0), 64, base.ClusterLayout{Partitions: 1, StripePages: 1})
	require.NoError(t, err)
	local, err := e.CreateTable("local", 64)
	require.NoError(t, err)
	gl := acquire(t, e, local.ID, testOwner, 0)
	ea := v.grant("acct", 0, testOwner)
	_, err = e.RegisterGrant(context.Background(), ti.ID, testOwner, ea)
	require.NoError(t, err)
	dir, _ := backupTo(t, e)
	// The original grants again after the backup.
	eb := v.grant("acct", 0, 5)
	_, err = e.RegisterGrant(context.Background(), ti.ID, 5, eb)
	require.NoError(t, err)

	_, err = Open(Options{Dir: dir})
	require.ErrorIs(t, err, ErrNoVerifier)
	v.mu.Lock()
	v.err = errors.New("etcd down")
	v.mu.Unlock()
	_, err = Open(Options{Dir: dir, GrantVerifier: v})
	require.ErrorIs(t, err, ErrGrantUnverified)
	v.mu.Lock()
	v.err = nil
	v.mu.Unlock()
	rev := v.rev
	c := openTest(t, Options{Dir: dir, GrantVerifier: v})
	ts := c.Tables()
	require.Len(t, ts, 2)
	// Every grant up to the restore is refused, eb (made after the backup) included.
	_, err = c.RegisterGrant(context.Background(), ti.ID, 5, eb)
	require.ErrorIs(t, err, ErrFenced)
	_, err = c.RegisterGrant(context.Background(), ti.ID, testOwner, ea)
	require.ErrorIs(t, err, ErrFenced)
	ec := v.grant("acct", 0, 6)
	require.Greater(t, ec, rev)
	_, err = c.RegisterGrant(context.Background(), ti.ID, 6, ec)
	require.NoError(t, err, "the next grant is accepted: the floor is etcd's revision, not 2^32 above it")
	// The local table was bumped.
	_, err = c.Acquire(local.ID, testOwner, gl.Epoch)
	require.ErrorIs(t, err, ErrFenced)
	g2 := acquire(t, c, local.ID, testOwner, 0)
	require.Greater(t, g2.Epoch, uint64(restoreEpochGap))
}

// countVerifier counts the verifications running at once, each waiting for release.
type countVerifier struct {
	mu       sync.Mutex
	running  int
	peak     int
	entered  chan struct{}
	release  chan struct{}
	deadline bool // every verification's context had a deadline
}

func (v *countVerifier) VerifyGrant(ctx context.Context, table string, p uint32, owner, epoch uint64) error {
	v.mu.Lock()
	v.running++
	v.peak = max(v.peak, v.running)
	if _, ok := ctx.Deadline(); !ok {
		v.deadline = false
	}
	v.mu.Unlock()
	v.entered <- struct{}{}
	defer func() { v.mu.Lock(); v.running--; v.mu.Unlock() }()
	select {
	case <-v.release:
		return fmt.Errorf("refused: %w", ErrFenced)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (v *countVerifier) Revision(context.Context) (uint64, error) { return 1, nil }

// At most grantVerifySlots verifications run at once, each under a deadline; the rest wait
// for a slot within their contexts.
func TestClusterVerifySlotsBounded(t *testing.T) {
	n := grantVerifySlots + 8
	v := &countVerifier{entered: make(chan struct{}, n), release: make(chan struct{}), deadline: true}
	e := openTest(t, Options{GrantVerifier: v, GrantVerifyTimeout: time.Minute})
	ti, err := e.CreateClusterTable(base.PartitionTableName("acct", 0), 64, base.ClusterLayout{Partitions: 1, StripePages: 1})
	require.NoError(t, err)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := e.RegisterGrant(context.Background(), ti.ID, uint64(100+i), uint64(1000+i))
			errs <- err
		}()
	}
	for range grantVerifySlots {
		<-v.entered
	}
	// The others wait for a slot: none enters until one is released.
	select {
	case <-v.entered:
		t.Fatal("more verifications than slots ran at once")
	default:
	}
	close(v.release)
	for range n {
		require.ErrorIs(t, <-errs, ErrFenced)
	}
	require.LessOrEqual(t, v.peak, grantVerifySlots)
	require.True(t, v.deadline, "every verification is bounded in time")
}

// anyVerifier accepts the grant of epoch e to owner e+1000, of any table: every registration
// is valid in etcd, so only the storage node's floor decides.
type anyVerifier struct{}

func (anyVerifier) VerifyGrant(ctx context.Context, table string, p uint32, owner, epoch uint64) error {
	if owner != epoch+1000 {
		return fmt.Errorf("owner %d epoch %d: %w", owner, epoch, ErrFenced)
	}
	return nil
}

func (anyVerifier) Revision(context.Context) (uint64, error) { return 1, nil }

// Concurrent registrations of random epochs: a registration that succeeds is never below one
// that had succeeded before it started (the floor only rises), the table ends at the highest
// success, and so does it after a restart.
func TestClusterRegisterConcurrentFloor(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s, ok := testseed.Replay(t); ok {
		seed = s
	}
	t.Logf("seed %d (WEFT_SEED replays)", seed)
	dir := t.TempDir()
	e := openTest(t, Options{Dir: dir, Sync: SyncNone, GrantVerifier: anyVerifier{}})
	ti, err := e.CreateClusterTable(base.PartitionTableName("acct", 0), 64, base.ClusterLayout{Partitions: 1, StripePages: 1})
	require.NoError(t, err)
	workers, each := testseed.Scaled(4, 8, 16), testseed.Scaled(20, 50, 200)
	var maxDone atomic.Uint64
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for range each {
				epoch := 1 + rng.Uint64N(uint64(workers*each))
				before := maxDone.Load()
				g, err := e.RegisterGrant(context.Background(), ti.ID, epoch+1000, epoch)
				if errors.Is(err, ErrFenced) {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				if g.Epoch != epoch || epoch < before {
					errs <- fmt.Errorf("epoch %d accepted after %d had been", epoch, before)
					return
				}
				for {
					m := maxDone.Load()
					if epoch <= m || maxDone.CompareAndSwap(m, epoch) {
						break
					}
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		require.NoError(t, <-errs)
	}
	top := maxDone.Load()
	require.NotZero(t, top)
	_, err = e.RegisterGrant(context.Background(), ti.ID, top+1000, top)
	require.NoError(t, err, "the highest success is the current grant")
	e.crashForTest()
	e = openTest(t, Options{Dir: dir, GrantVerifier: anyVerifier{}})
	_, err = e.RegisterGrant(context.Background(), ti.ID, top+1000, top)
	require.NoError(t, err, "the current grant after a restart")
	if top > 1 {
		_, err = e.RegisterGrant(context.Background(), ti.ID, top-1+1000, top-1)
		require.ErrorIs(t, err, ErrFenced)
	}
}
