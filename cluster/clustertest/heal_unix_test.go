//go:build unix

package clustertest_test

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster/clustertest"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/txnode"
)

// startHealing starts a cluster of two storage nodes with the table name of parts partitions,
// one row of value 7 in each (createRows), and opens a node of owner whose transaction nodes
// give up after a short RequestTimeout (300 ms), with its handle of the table.
func startHealing(t *testing.T, ctx context.Context, owner uint64, name string, parts int) (*clustertest.Cluster, *node.Node, *node.Table, []uint64) {
	t.Helper()
	c := clustertest.Start(t, clustertest.Options{StorageNodes: 2})
	ids := createRows(t, c, name, parts, 1, 7)
	n := c.OpenNodeWith(owner, "", node.Config{RequestTimeout: 300 * time.Millisecond, DialTimeout: time.Second})
	tbl, err := n.OpenTable(ctx, name)
	require.NoError(t, err)
	return c, n, tbl, ids
}

// A storage node killed with -9 and kept down past its transaction node's (short, injected)
// RequestTimeout: the cluster node's transaction node of it gives up for good (txnode.DB.Err),
// the node replaces it once the storage node is back, re-registers the grants of the
// partitions it owned there, and goes on writing and reading without a reopen; every
// acknowledged write is on the storage node.
func TestStorageNodeBackNodeHeals(t *testing.T) {
	testkit.SkipUnderRace(t, "a kill suite (child processes)")
	ctx := testCtx(t, 120*time.Second)
	// Six partitions: 0, 2, 4 on storage node 0 (the one killed), 1, 3, 5 on 1.
	c, n, tbl, ids := startHealing(t, ctx, 0x4ea1, "heal", 6)
	require.NoError(t, tbl.Own(ctx, 0, 1, 2))
	s0 := c.StorageOf(tbl.NodeOf(ids[0]))
	require.NotNil(t, s0)

	acked := map[uint64]uint64{} // inserted id -> its value
	var seq uint64
	insert := func() error {
		seq++
		id, err := tbl.Insert(ctx, u64Row(seq))
		if err == nil {
			acked[id] = seq
		}
		return err
	}
	lastPut := uint64(7) // ids[0]'s last acknowledged value
	put := func() error {
		seq++
		err := tbl.Put(ctx, ids[0], u64Row(seq))
		if err == nil {
			lastPut = seq
		}
		return err
	}
	for range 12 {
		require.NoError(t, insert())
		require.NoError(t, put())
	}

	s0.Kill()
	// Writes to the dead storage node's partitions wait for it, then fail once its
	// transaction node gives up (RequestTimeout, or its lease plus txnode's 2 s owner-in-use margin).
	putErr := writeUntilFails(t, put)
	t.Logf("write after the kill: %v", putErr)
	// Still down: later calls fail (a dial that fails, then a backoff), they do not hang.
	for range 3 {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := tbl.Put(octx, ids[0], u64Row(1))
		cancel()
		require.Error(t, err)
	}

	restartStorage(t, s0)
	// The node heals on its next uses: a write may fail while it redials (backoff), then
	// succeeds, without OpenTable or Own.
	healed := untilWithin(ctx, 200, func(octx context.Context) bool {
		if tbl.Put(octx, ids[0], u64Row(seq+1)) != nil {
			return false
		}
		seq++
		lastPut = seq
		return true
	})
	require.True(t, healed, "the node did not heal")
	require.ElementsMatch(t, []uint32{0, 1, 2}, tbl.Owned())
	for range 24 {
		require.NoError(t, insert())
		require.NoError(t, put())
	}
	// A non-owned partition of the healed storage node: its durable rows.
	require.EqualValues(t, 7, readU64(t, ctx, tbl, ids[4]))
	// A transaction over both storage nodes.
	require.NoError(t, n.Update(ctx, func(tx *node.Tx) error {
		for _, id := range []uint64{ids[1], ids[2]} {
			if err := tx.Update(tbl, id, func(row []byte) error {
				binary.LittleEndian.PutUint64(row, binary.LittleEndian.Uint64(row)+1)
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	}))

	// Every acknowledged write, read by another node from the storage nodes' durable rows.
	r, err := c.OpenNode(0x4ea2, "").OpenTable(ctx, "heal")
	require.NoError(t, err)
	require.Equal(t, lastPut, readU64(t, ctx, r, ids[0]))
	for id, v := range acked {
		require.Equal(t, v, readU64(t, ctx, r, id), "row %d", id)
	}
	require.EqualValues(t, 8, readU64(t, ctx, r, ids[1]))
	require.EqualValues(t, 8, readU64(t, ctx, r, ids[2]))
	// The grants were re-registered, not taken anew by another node.
	var ne *node.NotOwnerError
	require.False(t, errors.As(tbl.Put(ctx, ids[2], u64Row(9)), &ne))
}

// A Table handle that OpenTable replaced after a move (the map changed, so OpenTable
// returns a new handle) still owns its partitions and follows the map: a heal of a
// storage node re-registers that handle's grants too, not only the newest handle's. On
// 6387942 the heal knew only the newest handle per name, so the replaced one kept its
// owned tables on the dead transaction node and never wrote again.
func TestStorageNodeBackReplacedHandleHeals(t *testing.T) {
	testkit.SkipUnderRace(t, "a kill suite (child processes)")
	ctx := testCtx(t, 120*time.Second)
	// Three partitions: 0, 2 on storage node 0 (the one killed), 1 on 1.
	c, n, tbl, ids := startHealing(t, ctx, 0x4eb1, "healold", 3)
	for p, id := range ids {
		require.EqualValues(t, p, tbl.Partition(id))
	}
	require.NoError(t, tbl.Own(ctx, 0, 2))
	addr0 := tbl.NodeOf(ids[0])
	s0 := c.StorageOf(addr0)
	require.NotNil(t, s0)
	// Partition 1 (not owned) moves to storage node 0: the map changes, so OpenTable
	// returns a new handle; the old one keeps owning 0 and 2.
	require.NoError(t, tbl.Move(ctx, 1, addr0))
	t2, err := n.OpenTable(ctx, "healold")
	require.NoError(t, err)
	require.NotSame(t, tbl, t2)
	require.NoError(t, tbl.Put(ctx, ids[0], u64Row(8)))

	s0.Kill()
	writeUntilFails(t, func() error { return tbl.Put(ctx, ids[0], u64Row(9)) })
	restartStorage(t, s0)
	healed := untilWithin(ctx, 200, func(octx context.Context) bool { return tbl.Put(octx, ids[2], u64Row(10)) == nil })
	require.True(t, healed, "the replaced handle did not heal")
	require.ElementsMatch(t, []uint32{0, 2}, tbl.Owned())
	require.NoError(t, tbl.Put(ctx, ids[0], u64Row(11)))
	r, err := c.OpenNode(0x4eb2, "").OpenTable(ctx, "healold")
	require.NoError(t, err)
	require.EqualValues(t, 11, readU64(t, ctx, r, ids[0]))
	require.EqualValues(t, 10, readU64(t, ctx, r, ids[2]))
}

// errLog records the messages of a logger's Error records.
type errLog struct {
	mu   sync.Mutex
	msgs []string
}

func (l *errLog) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelError }
func (l *errLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
	l.msgs = append(l.msgs, msg)
	return nil
}
func (l *errLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *errLog) WithGroup(string) slog.Handler      { return l }
func (l *errLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.msgs)
}

// In WriteBack mode a write acknowledged from the cache and not flushed when the storage
// node died is lost with the dead transaction node (docs/cluster.md): the heal must not drop
// it silently. On 6387942 the dead transaction node's Close error (its unflushed commits) was
// discarded: nothing said that acknowledged writes were lost.
func TestStorageNodeBackWriteBackLossReported(t *testing.T) {
	testkit.SkipUnderRace(t, "a kill suite (child processes)")
	ctx := testCtx(t, 120*time.Second)
	c := clustertest.Start(t, clustertest.Options{StorageNodes: 2})
	// Partitions 0 (owned) and 2 (not) on storage node 0, 1 on 1.
	ids := createRows(t, c, "healwb", 3, 1, 7)
	logs := &errLog{}
	n := c.OpenNodeWith(0x4ec1, "", node.Config{Logger: slog.New(logs),
		Durability: txnode.WriteBack, FlushInterval: time.Hour,
		RequestTimeout: 300 * time.Millisecond, DialTimeout: time.Second})
	tbl, err := n.OpenTable(ctx, "healwb")
	require.NoError(t, err)
	require.NoError(t, tbl.Own(ctx, 0))
	s0 := c.StorageOf(tbl.NodeOf(ids[0]))
	require.NotNil(t, s0)
	require.Equal(t, s0.Addr, tbl.NodeOf(ids[0]))
	// Acknowledged from the cache, not flushed (an hour's flush interval).
	require.NoError(t, tbl.Put(ctx, ids[0], u64Row(8)))

	s0.Kill()
	// Its transaction node gives up on it: a durable read that cannot reach it.
	b := make([]byte, 64)
	dead := untilWithin(ctx, 100, func(octx context.Context) bool { return tbl.Get(octx, ids[2], b) != nil })
	require.True(t, dead)
	restartStorage(t, s0)
	healed := untilWithin(ctx, 200, func(octx context.Context) bool { return tbl.Put(octx, ids[0], u64Row(9)) == nil })
	require.True(t, healed)
	found := false
	for _, m := range logs.all() {
		if strings.Contains(m, "acknowledged") && strings.Contains(m, s0.Addr) {
			found = true
		}
	}
	require.True(t, found, "the loss of WriteBack's unflushed writes was not reported: %q", logs.all())
}

// A game whose every call has a short deadline (1 s, below the heal's backoff cap) heals
// too once the storage node is back: a caller whose context ends before the backoff does
// not grow it, and the backoff runs from the last failed dial, not from each call's start.
// On 6387942 each call waited the whole backoff from its own start and a wait cut short
// doubled it: past 1 s, no call ever dialled again.
func TestStorageNodeBackShortDeadlinesHeal(t *testing.T) {
	testkit.SkipUnderRace(t, "a kill suite (child processes)")
	ctx := testCtx(t, 120*time.Second)
	c := clustertest.Start(t, clustertest.Options{StorageNodes: 1})
	ids := createRows(t, c, "healshort", 1, 1, 7)
	n := c.OpenNodeWith(0x4ed1, "", node.Config{RequestTimeout: 200 * time.Millisecond, DialTimeout: 200 * time.Millisecond})
	tbl, err := n.OpenTable(ctx, "healshort")
	require.NoError(t, err)
	require.NoError(t, tbl.Own(ctx, 0))
	require.NoError(t, tbl.Put(ctx, ids[0], u64Row(8)))
	s0 := c.StorageOf(tbl.NodeOf(ids[0]))
	require.NotNil(t, s0)
	put := func(v uint64) error {
		octx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return tbl.Put(octx, ids[0], u64Row(v))
	}
	s0.Kill()
	// Its transaction node gives up on it (a write waits past RequestTimeout).
	writeUntilFails(t, func() error { return tbl.Put(ctx, ids[0], u64Row(9)) })
	// Down: enough failed calls for the backoff to pass the calls' deadline.
	for range 12 {
		require.Error(t, put(9))
	}
	restartStorage(t, s0)
	healed := false
	for try := 0; try < 40 && !healed; try++ {
		healed = put(10) == nil
	}
	require.True(t, healed, "calls of 1 s deadlines never healed")
	require.EqualValues(t, 10, readU64(t, ctx, tbl, ids[0]))
}

// writeUntilFails calls write until it fails (100 calls at the most: a killed storage node's
// writes wait for it, then fail) and returns that error; the test fails if none did.
func writeUntilFails(t *testing.T, write func() error) error {
	t.Helper()
	var err error
	for range 100 {
		if err = write(); err != nil {
			break
		}
	}
	require.Error(t, err)
	return err
}

// restartStorage restarts killed storage node s and waits until it listens again.
func restartStorage(t *testing.T, s *clustertest.StorageNode) {
	t.Helper()
	s.Restart()
	require.Equal(t, "listening "+s.Addr, s.Ready())
}

// untilWithin calls try, each call with a 5 s deadline under ctx, until it reports true (tries
// calls at the most), and returns whether it did.
func untilWithin(ctx context.Context, tries int, try func(ctx context.Context) bool) bool {
	done := false
	for range tries {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		done = try(octx)
		cancel()
		if done {
			break
		}
	}
	return done
}
