package storenode

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/vfs"
)

// stepVerifier is a GrantVerifier whose k-th verification (in the order they start) waits
// for gates[k] and then accepts: a slow etcd whose answers the test releases one by one. It
// ignores the context once it runs, so a test decides what happens after it returns.
type stepVerifier struct {
	mu      sync.Mutex
	n       int
	gates   []chan struct{}
	entered chan int
}

func newStepVerifier(n int) *stepVerifier {
	v := &stepVerifier{entered: make(chan int, n)}
	for range n {
		v.gates = append(v.gates, make(chan struct{}))
	}
	return v
}

func (v *stepVerifier) VerifyGrant(ctx context.Context, table string, p uint32, owner, epoch uint64) error {
	v.mu.Lock()
	k := v.n
	v.n++
	v.mu.Unlock()
	if k >= len(v.gates) {
		return fmt.Errorf("verification %d of %d: %w", k, len(v.gates), ErrFenced)
	}
	v.entered <- k
	<-v.gates[k]
	return nil
}

func (v *stepVerifier) Revision(context.Context) (uint64, error) { return 1, nil }

// walSyncGate holds every fsync of the WAL while set: entered is closed when the first is
// held, open() lets them go.
type walSyncGate struct {
	mu      sync.Mutex
	on      bool
	once    sync.Once
	entered chan struct{}
	gate    chan struct{}
}

func holdWALSyncs(fs *vfs.FaultFS) *walSyncGate {
	g := &walSyncGate{entered: make(chan struct{}), gate: make(chan struct{})}
	fs.Inject(func(op vfs.Op) error {
		g.mu.Lock()
		on := g.on
		g.mu.Unlock()
		if on && op.Kind == vfs.OpSync && strings.HasPrefix(op.Name, "db/wal/") {
			g.once.Do(func() { close(g.entered) })
			<-g.gate
		}
		return nil
	})
	return g
}

func (g *walSyncGate) hold() {
	g.mu.Lock()
	g.on = true
	g.mu.Unlock()
}

func (g *walSyncGate) open() {
	g.mu.Lock()
	g.on = false
	g.mu.Unlock()
	close(g.gate)
}

// A registration is answered only once its grant is durable, also when the same grant is
// registered again while the first registration's record waits for its fsync (a renewal, a
// retry after a reconnect, a second connection): a grant answered and then lost in a power
// cut would let the old owner write again after the restart, under a grant the new owner
// was told is fenced. Here the first registration's fsync is held; a second one that passed
// the first look before the grant was installed (the "registered meanwhile" path) and a third
// that finds it installed (the renewal path) must not succeed before the fsync; with their
// contexts ended they fail. Then the power goes: the grant is lost, as it may be, since no
// registration of it was answered.
func TestClusterRegisterAnsweredOnlyDurable(t *testing.T) {
	fs := vfs.NewFaultFS()
	v := newStepVerifier(3)
	opts := Options{Dir: "db", FS: fs, Logger: quietLogger, Sync: SyncAlways, CheckpointInterval: -1, CheckpointWALBytes: -1,
		GrantVerifier: v}
	e := openEngine(t, opts)
	ti, err := e.CreateClusterTable(base.PartitionTableName("acct", 0), 64, base.ClusterLayout{Partitions: 1, StripePages: 1})
	require.NoError(t, err)
	const a, b = 11, 22
	const ea, eb = 100, 200
	ctx := context.Background()
	first := make(chan error, 1)
	go func() { _, err := e.RegisterGrant(ctx, ti.ID, a, ea); first <- err }()
	require.Equal(t, 0, <-v.entered)
	close(v.gates[0])
	require.NoError(t, <-first, "a's grant, durable")

	gate := holdWALSyncs(fs)
	gate.hold()
	regB := make(chan error, 1)
	go func() { _, err := e.RegisterGrant(ctx, ti.ID, b, eb); regB <- err }()
	require.Equal(t, 1, <-v.entered)
	meanwhileCtx, cancelMeanwhile := context.WithCancel(ctx)
	meanwhile := make(chan error, 1)
	go func() { _, err := e.RegisterGrant(meanwhileCtx, ti.ID, b, eb); meanwhile <- err }()
	require.Equal(t, 2, <-v.entered, "the second registration passed the first look: b's grant is not installed yet")
	close(v.gates[1])
	<-gate.entered // b's grant is installed and its record waits for its fsync

	renewCtx, cancelRenew := context.WithCancel(ctx)
	cancelRenew()
	_, err = e.RegisterGrant(renewCtx, ti.ID, b, eb)
	require.ErrorIs(t, err, ErrGrantUnverified, "a renewal of a grant whose record is not durable is not answered before it is")
	require.ErrorIs(t, err, context.Canceled)
	cancelMeanwhile() // after it verified: it ignores the context from here on
	close(v.gates[2])
	err = <-meanwhile
	require.ErrorIs(t, err, ErrGrantUnverified, "a concurrent registration of the same grant is not answered before its record is durable")
	require.ErrorIs(t, err, context.Canceled)

	// The power goes with the record unsynced: b's grant was never answered, and is lost.
	fs.Crash(nil)
	gate.open()
	require.Error(t, <-regB)
	_ = e.Close()
	fs.Inject(nil)
	e = openEngine(t, opts)
	defer e.Close()
	_, _, err = e.AllocIDs(ti.ID, a, ea, 1)
	require.NoError(t, err, "a still holds the table: b's grant never became durable")
}

// NextID never answers an id below the one asked, also for ids at and past MaxRowID up to
// 2^64-1, where the last round of stripes below 2^64 is partial (its stripe start wraps).
func TestClusterNextIDHighIDs(t *testing.T) {
	layouts := []base.ClusterLayout{
		{Partitions: 3, StripePages: 1, Partition: 1},
		{Partitions: 3, StripePages: 1, Partition: 2},
		{Partitions: 1, StripePages: 1, Partition: 0},
		{Partitions: 5, StripePages: 7, Partition: 4},
		{Partitions: base.ClusterPartitionsMax, StripePages: base.ClusterStripePagesMax, Partition: base.ClusterPartitionsMax - 1},
	}
	ids := []uint64{MaxRowID - 1, MaxRowID, MaxRowID + 1, 1 << 63, ^uint64(0) - 200, ^uint64(0) - 64, ^uint64(0) - 1, ^uint64(0)}
	for _, l := range layouts {
		for _, id := range ids {
			next, ok := PartitionNextID(l, id)
			if ok {
				require.GreaterOrEqual(t, next, id, "layout %+v id %d", l, id)
				require.Less(t, next, uint64(MaxRowID), "layout %+v id %d", l, id)
				require.Equal(t, l.Partition, l.PartitionOf(next), "layout %+v id %d", l, id)
			}
		}
	}
}
