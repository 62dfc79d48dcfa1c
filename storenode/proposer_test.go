package storenode

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/vfs"
)

// TestReplicatedEnginesAgree: three engines, each with a Proposer of one in-memory log
// (memGroup), take random commits of a few owners through whichever engine leads, with
// pipelined batches (up to 8 in flight per owner), resends of batches in flight, entries
// delivered twice, engines applying at their own pace, requests sent to a follower, and leader
// changes that drop the uncommitted tail; now and then a new owner takes a table from its
// holder while the holder's batches are proposed behind the grant (refused at apply). Checked:
// every acknowledgement names the log entry of its batch, and one index per batch; no batch
// of an owner that still holds its table is refused; every engine applied each (owner, seq)
// once (commits counted = the seqs the dedup tables hold); at the end every engine holds the
// same state (captureReplayState: catalog, grants, next ids, dedup windows, rows), and the
// runs refused a stale owner at apply and answered duplicates from the dedup window.
//
// WEFT_REPL_SEED=n replays one seed (printed on failure).
func TestReplicatedEnginesAgree(t *testing.T) {
	seeds := []uint64{1, 2, 3, 4, 5, 6}
	if testing.Short() {
		seeds = seeds[:3]
	}
	if s := os.Getenv("WEFT_REPL_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
		seeds = []uint64{n}
	}
	var total replCounts
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			c := runReplicatedEnginesAgree(t, seed, 600)
			total.staleAtApply += c.staleAtApply
			total.dropsAtApply += c.dropsAtApply
			total.ownersExpired += c.ownersExpired
			total.dupEntries += c.dupEntries
			total.leaderChanges += c.leaderChanges
			total.acked += c.acked
			total.checkpoints += c.checkpoints
			total.diskReads += c.diskReads
		})
	}
	t.Logf("seeds %v: %+v", seeds, total)
	require.NotZero(t, total.staleAtApply, "no stale owner was refused at apply")
	require.NotZero(t, total.dropsAtApply, "no drop was refused at apply")
	require.NotZero(t, total.ownersExpired, "no owner expired")
	require.NotZero(t, total.dupEntries, "no batch was committed twice")
	require.NotZero(t, total.leaderChanges)
	require.NotZero(t, total.diskReads, "no page was evicted and read back")
}

// replCounts are what a run of TestReplicatedEnginesAgree covered.
type replCounts struct {
	staleAtApply  int    // batches of a stale owner refused (ErrFenced) after they were proposed
	dropsAtApply  int    // drops refused at apply (the table dropped by the drop proposed before)
	ownersExpired uint64 // owners dropped by expiry entries, summed over the engines
	dupEntries    int    // commit entries of an (owner, seq) committed before
	leaderChanges int
	acked         int
	checkpoints   uint64 // by every engine, Close's not counted
	diskReads     uint64 // pages evicted and read back (the small cache's seeds)
}

// replRun is one run: the group, its clients, the random source.
type replRun struct {
	t       *testing.T
	seed    uint64
	rnd     *rand.Rand
	g       *memGroup
	clock   *fakeClock
	clients []*replClient
	owners  uint64          // the last owner id handed out
	tables  map[string]bool // the model: the names a create or drop acknowledged last, true if created
	scratch int             // the last scratch table (createDrop) made
	counts  replCounts
}

// replClient is one owner (a transaction node): its table and grant, its batches not
// acknowledged by seq, and whether a newer owner took its table (stale).
type replClient struct {
	owner   uint64
	table   uint32
	epoch   uint64
	next    uint64
	pending map[uint64]*replBatch
	stale   bool
	acks    map[uint64]uint64 // seq -> the index acknowledged
}

// replBatch is a batch not acknowledged yet and how many of its attempts wait for an outcome.
type replBatch struct {
	b        *base.Batch
	hash     uint64
	inflight int
}

const replRowBytes = 16

// replOwnerExpiry is the engines' OwnerExpiry: the checkpoint op passes it now and then, so the
// leader proposes the expiry of the stale owners (their tables taken by steal).
const replOwnerExpiry = time.Hour

func runReplicatedEnginesAgree(t *testing.T, seed uint64, steps int) replCounts {
	r := &replRun{t: t, seed: seed, rnd: rand.New(rand.NewPCG(seed, seed^0x7e91)), g: newMemGroup(t, 3), clock: &fakeClock{}, tables: map[string]bool{}}
	r.clock.Now()
	cache := int64(0) // the default: nothing evicted
	if seed%2 == 0 {
		cache = MinCacheBytes // 16 pages of 1 KiB for up to 32: applies wait for checkpoints
	}
	for i := range r.g.engines {
		r.g.engines[i] = openEngine(t, Options{Dir: "db", FS: vfs.NewFaultFS(), Logger: quietLogger, Now: r.clock.Now,
			CheckpointInterval: -1, TxnResolveInterval: -1, OwnerExpiry: replOwnerExpiry, Sync: SyncAlways, SeqGapWait: 2 * time.Second,
			CacheBytes: cache, Proposer: &memProposer{g: r.g, self: i}})
	}
	closed := false
	defer func() {
		for _, e := range r.g.engines {
			if !closed {
				e.Close()
			}
		}
	}()
	r.g.changeLeader(0)
	for i := range 3 {
		r.newClient(fmt.Sprintf("t%d", i))
	}
	ops := []struct {
		weight int
		fn     func()
	}{
		{30, r.send}, {4, r.resend}, {3, r.sendToFollower}, {20, r.commitTail}, {20, r.apply},
		{2, r.changeLeader}, {1, r.steal}, {1, r.checkpoint}, {1, r.createDrop},
	}
	total := 0
	for _, op := range ops {
		total += op.weight
	}
	for step := range steps {
		n := r.rnd.IntN(total)
		for _, op := range ops {
			if n -= op.weight; n < 0 {
				op.fn()
				break
			}
		}
		for i, e := range r.g.engines {
			require.NoError(t, e.failure(), "seed %d step %d: engine %d failed", seed, step, i)
		}
	}
	r.g.drain()
	r.check()
	closed = true
	for i, e := range r.g.engines {
		require.NoError(t, e.Close(), "seed %d: close engine %d", seed, i) // its final checkpoint
	}
	return r.counts
}

// leader returns the leading engine.
func (r *replRun) leader() *Engine {
	r.g.mu.Lock()
	defer r.g.mu.Unlock()
	return r.g.engines[r.g.leader]
}

// newClient makes a new owner the holder of table name (created if missing), with ids granted.
func (r *replRun) newClient(name string) *replClient {
	r.owners++
	c := &replClient{owner: 100 + r.owners, next: 1, pending: map[uint64]*replBatch{}, acks: map[uint64]uint64{}}
	e := r.leader()
	require.NoError(r.t, r.g.call(func() error {
		info, err := e.OpenTable(name)
		if errors.Is(err, ErrTableNotFound) {
			info, err = e.CreateTable(name, replRowBytes)
			r.tables[name] = err == nil
		}
		if err != nil {
			return err
		}
		c.table = info.ID
		g, err := e.Acquire(c.table, c.owner, 0)
		if err != nil {
			return err
		}
		c.epoch = g.Epoch
		if info.NextID == 0 {
			_, _, err = e.AllocIDs(c.table, c.owner, c.epoch, 4)
		}
		return err
	}), "seed %d", r.seed)
	r.clients = append(r.clients, c)
	return c
}

// live returns a random client that still holds its table.
func (r *replRun) live() *replClient {
	var live []*replClient
	for _, c := range r.clients {
		if !c.stale {
			live = append(live, c)
		}
	}
	return live[r.rnd.IntN(len(live))]
}

// batch builds c's batch of seq: one to three rows of a page of its table, holding (owner, seq).
func (r *replRun) batch(c *replClient, seq uint64) *replBatch {
	var data uint64
	for range 1 + r.rnd.IntN(3) {
		data |= 1 << r.rnd.IntN(64)
	}
	rows := make([]byte, bits.OnesCount64(data)*replRowBytes)
	for i := 0; i < len(rows); i += replRowBytes {
		binary.LittleEndian.PutUint64(rows[i:], c.owner)
		binary.LittleEndian.PutUint64(rows[i+8:], seq)
	}
	b := &base.Batch{Owner: c.owner, Seq: seq, Fences: []base.Fence{{Table: c.table, Epoch: c.epoch}},
		Segments: []base.Segment{{Table: c.table, RowBytes: replRowBytes, Page: uint64(r.rnd.IntN(4)), Data: data, Rows: rows}}}
	return &replBatch{b: b, hash: batchHash(b)}
}

// attempt sends c's batch pb to e; the outcome is checked when it comes.
func (r *replRun) attempt(e *Engine, c *replClient, pb *replBatch) {
	pb.inflight++
	seq := pb.b.Seq
	e.Commit(pb.b, func(index uint64, err error) {
		pb.inflight--
		switch {
		case err == nil:
			r.acked(c, pb, index)
		case errors.Is(err, ErrUnknownOutcome), errors.Is(err, ErrNotLeader):
			// Resent later (resendAll).
		case c.stale && (errors.Is(err, ErrFenced) || errors.Is(err, ErrSeqGap)):
			// Refused: a newer owner holds the table.
		default:
			r.t.Fatalf("seed %d: owner %d seq %d: %v", r.seed, c.owner, seq, err)
		}
	})
}

// acked checks the acknowledgement of pb at index: the log entry there is its batch, and every
// acknowledgement of it names the same index.
func (r *replRun) acked(c *replClient, pb *replBatch, index uint64) {
	ent, ok := r.g.entry(index)
	require.True(r.t, ok, "seed %d: owner %d seq %d acknowledged at %d, not in the log", r.seed, c.owner, pb.b.Seq, index)
	require.Equal(r.t, kindCommit, ent.kind, "seed %d: owner %d seq %d acknowledged at %d", r.seed, c.owner, pb.b.Seq, index)
	var rec commitRecord
	require.NoError(r.t, decodeCommitRecord(ent.payload, &rec))
	require.Equal(r.t, [3]uint64{c.owner, pb.b.Seq, pb.hash}, [3]uint64{rec.owner, rec.seq, rec.hash},
		"seed %d: acknowledged at %d, which holds another batch", r.seed, index)
	if at, ok := c.acks[pb.b.Seq]; ok {
		require.Equal(r.t, at, index, "seed %d: owner %d seq %d acknowledged at two indexes", r.seed, c.owner, pb.b.Seq)
	}
	c.acks[pb.b.Seq] = index
	delete(c.pending, pb.b.Seq)
	r.counts.acked++
}

// resendAll sends again, in seq order, every batch of c not acknowledged whose attempts all
// ended; it reports whether there was one.
func (r *replRun) resendAll(e *Engine, c *replClient) bool {
	any := false
	for seq := firstPending(c); seq < c.next; seq++ {
		if pb := c.pending[seq]; pb != nil && pb.inflight == 0 {
			any = true
			r.attempt(e, c, pb)
		}
	}
	return any
}

// firstPending returns the lowest seq of c not acknowledged (c.next if none).
func firstPending(c *replClient) uint64 {
	low := c.next
	for seq := range c.pending {
		low = min(low, seq)
	}
	return low
}

// send: a live owner resends what ended without an acknowledgement, or else sends its next
// batch (at most 8 in flight).
func (r *replRun) send() {
	c, e := r.live(), r.leader()
	if r.resendAll(e, c) || len(c.pending) >= 8 {
		return
	}
	pb := r.batch(c, c.next)
	c.pending[c.next] = pb
	c.next++
	r.attempt(e, c, pb)
}

// resend sends a batch in flight again (a client timeout): both may commit.
func (r *replRun) resend() {
	c := r.live()
	if pb := c.pending[firstPending(c)]; pb != nil && pb.inflight > 0 {
		r.attempt(r.leader(), c, pb)
	}
}

// sendToFollower sends an owner's next batch to an engine that does not lead.
func (r *replRun) sendToFollower() {
	c := r.live()
	r.g.mu.Lock()
	i := (r.g.leader + 1 + r.rnd.IntN(len(r.g.engines)-1)) % len(r.g.engines)
	r.g.mu.Unlock()
	if len(c.pending) > 0 {
		r.resendAll(r.g.engines[i], c)
		return
	}
	pb := r.batch(c, c.next)
	c.pending[c.next] = pb
	c.next++
	r.attempt(r.g.engines[i], c, pb)
}

// commitTail commits part of the tail, an entry now and then twice.
func (r *replRun) commitTail() {
	r.g.mu.Lock()
	n := len(r.g.tail)
	r.g.mu.Unlock()
	if n > 0 {
		r.g.commit(1+r.rnd.IntN(n), func() bool { return r.rnd.IntN(8) == 0 })
	}
}

// apply lets a random engine apply part of what it is behind.
func (r *replRun) apply() {
	i := r.rnd.IntN(len(r.g.engines))
	if n := r.g.behind(i); n > 0 {
		r.g.apply(i, 1+r.rnd.IntN(n))
	}
}

// checkpoint checkpoints a random engine at its applied index; now and then the clock passes
// OwnerExpiry first and the leader checkpoints, proposing the expiry of the idle owners that
// hold no table (every replica drops them at the entry's apply, none on its own clock).
func (r *replRun) checkpoint() {
	i := r.rnd.IntN(len(r.g.engines))
	if r.rnd.IntN(3) == 0 {
		r.clock.Advance(replOwnerExpiry + time.Second)
		r.g.mu.Lock()
		i = r.g.leader
		r.g.mu.Unlock()
	}
	require.NoError(r.t, r.g.engines[i].Checkpoint(), "seed %d: checkpoint of engine %d", r.seed, i)
}

func (r *replRun) changeLeader() {
	r.g.changeLeader(r.rnd.IntN(len(r.g.engines)))
	r.counts.leaderChanges++
}

// steal: past the holder's lease a new owner takes a live owner's table; before the grant
// commits, the old owner's next batch passes the leader's check (the grant is not applied) and
// is proposed behind it, so the apply refuses it (ErrFenced) on every engine.
func (r *replRun) steal() {
	if len(r.clients) >= 8 {
		return
	}
	old := r.live()
	e := r.leader()
	r.g.drain() // the old owner's batches before the grant commit as they were proposed
	if !r.resendAll(e, old) && len(old.pending) < 8 {
		pb := r.batch(old, old.next)
		old.pending[old.next] = pb
		old.next++
		r.attempt(e, old, pb)
	}
	r.g.drain()
	r.clock.Advance(e.LeaseDuration() + time.Second)
	select {
	case <-r.g.proposed: // stale signals
	default:
	}
	r.owners++
	c := &replClient{owner: 100 + r.owners, table: old.table, next: 1, pending: map[uint64]*replBatch{}, acks: map[uint64]uint64{}}
	done := make(chan error, 1)
	go func() {
		g, err := e.Acquire(c.table, c.owner, 0)
		c.epoch = g.Epoch
		done <- err
	}()
	select {
	case <-r.g.proposed: // the grant is in the tail (nothing else proposes meanwhile)
	case err := <-done:
		r.t.Fatalf("seed %d: owner %d takes table %d before its grant is proposed: %v", r.seed, c.owner, c.table, err)
	}
	old.stale = true
	pb := r.batch(old, old.next)
	old.pending[old.next] = pb
	old.next++
	r.attempt(e, old, pb) // checked against the applied grant: proposed
	r.g.drain()
	require.NoError(r.t, <-done, "seed %d: owner %d takes table %d", r.seed, c.owner, c.table)
	require.Zero(r.t, pb.inflight, "seed %d: the stale batch has no outcome", r.seed)
	_, acked := old.acks[pb.b.Seq]
	require.False(r.t, acked, "seed %d: the stale owner's batch was acknowledged", r.seed)
	r.g.mu.Lock()
	ent := r.g.log[len(r.g.log)-1] // proposed behind the grant: refused at apply, not before
	for i := len(r.g.log) - 1; ent.kind == kindExpired && i > 0; i-- {
		ent = r.g.log[i-1] // an expiry a background checkpoint proposed meanwhile
	}
	r.g.mu.Unlock()
	var rec commitRecord
	require.Equal(r.t, kindCommit, ent.kind, "seed %d: the stale batch was not proposed", r.seed)
	require.NoError(r.t, decodeCommitRecord(ent.payload, &rec))
	require.Equal(r.t, [2]uint64{old.owner, pb.b.Seq}, [2]uint64{rec.owner, rec.seq}, "seed %d: the stale batch was not proposed last", r.seed)
	r.counts.staleAtApply++
	r.clients = append(r.clients, c)
}

// createDrop creates a scratch table (a local or a cluster one) and drops it twice, both drops
// proposed before either commits: the first applies, the second is refused at apply
// (ErrTableNotFound) on every engine. Now and then the table is left for a later createDrop
// to drop, with a commit of its own behind the drop.
func (r *replRun) createDrop() {
	e := r.leader()
	if r.scratch == 0 || r.rnd.IntN(2) == 0 {
		r.scratch++
		name := fmt.Sprintf("x%d", r.scratch)
		require.NoError(r.t, r.g.call(func() error {
			var err error
			if r.rnd.IntN(2) == 0 {
				name = base.PartitionTableName(name, 0)
				_, err = e.CreateClusterTable(name, replRowBytes, base.ClusterLayout{Partitions: 1, StripePages: 1})
			} else {
				_, err = e.CreateTable(name, replRowBytes)
			}
			return err
		}), "seed %d: create %q", r.seed, name)
		r.tables[name] = true
		if r.rnd.IntN(3) == 0 {
			return
		}
	}
	var name string
	for n, live := range r.tables {
		if live && strings.HasPrefix(n, "x") && (name == "" || n < name) {
			name = n
		}
	}
	if name == "" {
		return
	}
	r.g.drain()
	select {
	case <-r.g.proposed: // stale signals
	default:
	}
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- e.DropTable(name, 0) }()
		select {
		case <-r.g.proposed:
		case err := <-errs:
			r.t.Fatalf("seed %d: drop of %q returned before it was proposed: %v", r.seed, name, err)
		}
	}
	r.g.drain()
	e1, e2 := <-errs, <-errs
	if e1 != nil {
		e1, e2 = e2, e1
	}
	require.NoError(r.t, e1, "seed %d: drop %q", r.seed, name)
	require.ErrorIs(r.t, e2, ErrTableNotFound, "seed %d: the second drop of %q", r.seed, name)
	r.tables[name] = false
	r.counts.dropsAtApply++
}

// replicaState is captureReplayState without what is local to a replica: the meta line is
// the meta's catalog, grants, next ids and dedup windows without the published page maps, and
// the dropped tables whose files wait for a checkpoint are left out (each replica checkpoints
// on its own: docs/replication.md 1.3).
func replicaState(t *testing.T, e *Engine) []string {
	lines := slices.DeleteFunc(captureReplayState(t, e), func(l string) bool {
		return strings.HasPrefix(l, "meta ") || strings.HasPrefix(l, "dropped ")
	})
	e.mu.Lock()
	m := e.snapshotMeta()
	e.mu.Unlock()
	for i := range m.tables {
		m.tables[i].pages = nil
	}
	meta := encodeMeta(m)
	lines = append(lines, fmt.Sprintf("meta without page maps %d bytes, xxhash %x", len(meta), xxhash.Sum64(meta)))
	slices.Sort(lines)
	return lines
}

// check compares the engines and counts each one's applied commits against its dedup table.
func (r *replRun) check() {
	expired := map[uint64]uint64{} // owner -> the highest seq an expiry entry names
	for index := uint64(1); ; index++ {
		ent, ok := r.g.entry(index)
		if !ok {
			break
		}
		if ent.kind == kindExpired {
			require.NoError(r.t, decodeExpiredRecord(ent.payload, func(x expiredOwner) { expired[x.owner] = max(expired[x.owner], x.seq) }))
		}
	}
	var want []string
	for i, e := range r.g.engines {
		e.mu.Lock()
		seqs := uint64(0)
		for _, o := range e.owners {
			seqs += o.lastSeq // every owner's first seq is 1, and its seqs apply in order
		}
		for owner, seq := range expired {
			if e.owners[owner] == nil {
				seqs += seq // dropped by an expiry entry: the last seq one names
			}
		}
		e.mu.Unlock()
		r.counts.ownersExpired += e.stats.ownersExpired.Load()
		require.Equal(r.t, seqs, e.stats.commits.Load(), "seed %d engine %d: commits applied vs seqs in the dedup table", r.seed, i)
		r.counts.checkpoints += e.stats.checkpoints.Load()
		r.counts.diskReads += e.stats.diskReads.Load()
		names := map[string]bool{}
		for n, live := range r.tables {
			if live {
				names[n] = true
			}
		}
		for _, info := range e.Tables() {
			require.True(r.t, names[info.Name], "seed %d engine %d: table %q is not in the model", r.seed, i, info.Name)
			delete(names, info.Name)
		}
		require.Empty(r.t, names, "seed %d engine %d: tables of the model missing", r.seed, i)
		got := replicaState(r.t, e)
		if i == 0 {
			want = got
			continue
		}
		requireSameLines(r.t, want, got, fmt.Sprintf("seed %d: engine %d differs from engine 0", r.seed, i))
	}
	seen := map[[2]uint64]bool{}
	for index := uint64(1); ; index++ {
		ent, ok := r.g.entry(index)
		if !ok {
			break
		}
		if ent.kind != kindCommit {
			continue
		}
		var rec commitRecord
		require.NoError(r.t, decodeCommitRecord(ent.payload, &rec))
		k := [2]uint64{rec.owner, rec.seq}
		if seen[k] {
			r.counts.dupEntries++
		}
		seen[k] = true
	}
	e := r.g.engines[0]
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range r.clients {
		o := e.owners[c.owner]
		for seq := range c.acks {
			applied := o != nil && seq <= o.lastSeq || o == nil && seq <= expired[c.owner]
			require.True(r.t, applied, "seed %d: owner %d seq %d acknowledged, not applied", r.seed, c.owner, seq)
			require.True(r.t, o != nil || c.stale, "seed %d: owner %d expired while it holds its table", r.seed, c.owner)
		}
	}
	r.t.Logf("seed %d: %+v, log %d entries", r.seed, r.counts, len(r.g.log))
}

// TestReplicaRefuses: a replica that does not lead refuses requests (drops too) with
// ErrNotLeader, nothing proposed (move steps and marks too); under a Proposer the kinds not replicated yet
// (MoveActivate, MoveWrite) fail with ErrNotReplicated, nothing applied; ApplyCommitted on a standalone engine is an error.
func TestReplicaRefuses(t *testing.T) {
	g := newMemGroup(t, 2)
	for i := range g.engines {
		g.engines[i] = openEngine(t, Options{Dir: "db", FS: vfs.NewFaultFS(), Logger: quietLogger, CheckpointInterval: -1,
			TxnResolveInterval: -1, Proposer: &memProposer{g: g, self: i}})
		defer g.engines[i].Close()
	}
	g.changeLeader(0)
	var info base.TableInfo
	require.NoError(t, g.call(func() (err error) { info, err = g.engines[0].CreateTable("t", 16); return err }))
	g.apply(1, math.MaxInt)

	f := g.engines[1]
	_, err := f.CreateTable("u", 16)
	require.ErrorIs(t, err, ErrNotLeader)
	_, err = f.Acquire(info.ID, 7, 0)
	require.ErrorIs(t, err, ErrNotLeader)
	_, _, err = f.AllocIDs(info.ID, 7, 1, 1)
	require.ErrorIs(t, err, ErrNotLeader)
	require.NoError(t, g.call(func() error { _, err := g.engines[0].Acquire(info.ID, 7, 0); return err }))
	g.apply(1, math.MaxInt)
	_, err = f.RenewGrant(info.ID, 7, 1)
	require.ErrorIs(t, err, ErrNotLeader, "a follower renewed")
	_, err = g.engines[0].RenewGrant(info.ID, 7, 1)
	require.NoError(t, err)
	_, err = f.CommitWait(&base.Batch{Owner: 7, Seq: 1, Fences: []base.Fence{{Table: info.ID, Epoch: 1}},
		Segments: []base.Segment{{Table: info.ID, RowBytes: 16, Page: 0, Data: 1, Rows: make([]byte, 16)}}})
	require.ErrorIs(t, err, ErrNotLeader)
	g.mu.Lock()
	require.Empty(t, g.tail, "a follower proposed")
	g.mu.Unlock()

	var ci base.TableInfo
	require.NoError(t, g.call(func() (err error) {
		ci, err = g.engines[0].CreateClusterTable(base.PartitionTableName("c", 0), 16, base.ClusterLayout{Partitions: 1, StripePages: 1})
		return err
	}))
	g.apply(1, math.MaxInt)
	require.ErrorIs(t, f.MoveBegin(ci.ID, 1), ErrNotLeader)
	_, err = f.MoveFreeze(ci.ID, 1)
	require.ErrorIs(t, err, ErrNotLeader)
	require.ErrorIs(t, f.MoveThaw(ci.ID, 1), ErrNotLeader)
	require.ErrorIs(t, f.MoveRetire(ci.ID, 1), ErrNotLeader)
	_, err = f.MoveMark(ci.ID)
	require.ErrorIs(t, err, ErrNotLeader)
	require.ErrorIs(t, g.engines[0].MoveActivate(ci.ID, 1, 1, 64), ErrNotReplicated)
	_, err = g.engines[0].MoveWrite([]base.Segment{{Table: ci.ID, RowBytes: 16, Page: 0, Data: 1, Rows: make([]byte, 16)}}, 1)
	require.ErrorIs(t, err, ErrNotReplicated)
	for _, x := range g.engines {
		require.Nil(t, x.moveOf(x.tables[ci.ID]), "a move step applied")
		require.Zero(t, x.tables[ci.ID].nextID, "an activation's or a write's id grant applied")
	}
	require.ErrorIs(t, f.DropTable("t", 0), ErrNotLeader)

	e := openEngine(t, Options{Dir: "db", FS: vfs.NewFaultFS(), Logger: quietLogger, CheckpointInterval: -1})
	defer e.Close()
	require.Error(t, e.ApplyCommitted(1, 0, kindCreateTable, appendCreateRecord(nil, 1, 16, "t")))
	_, err = e.OpenTable("t")
	require.ErrorIs(t, err, ErrTableNotFound)
}

// TestReplicatedClusterGrants: cluster tables under a Proposer. A cluster create, etcd grant
// registrations (verified on the leader, proposed, applied on every replica), a renewal, and
// cluster id grants (the partition's stripes) reach every engine; a registration proposed
// behind a higher one is refused on the leader (ErrFenced), two proposed in epoch order both
// apply, a follower refuses with ErrNotLeader, and entries delivered twice change nothing.
func TestReplicatedClusterGrants(t *testing.T) {
	v := newMemVerifier()
	g := newMemGroup(t, 3)
	for i := range g.engines {
		g.engines[i] = openEngine(t, Options{Dir: "db", FS: vfs.NewFaultFS(), Logger: quietLogger, CheckpointInterval: -1,
			TxnResolveInterval: -1, GrantVerifier: v, Proposer: &memProposer{g: g, self: i}})
		defer g.engines[i].Close()
	}
	g.changeLeader(0)
	ctx := context.Background()
	e := g.engines[0]
	name := base.PartitionTableName("c", testLayout.Partition)
	var info base.TableInfo
	require.NoError(t, g.call(func() (err error) { info, err = e.CreateClusterTable(name, 16, testLayout); return err }))
	ra := v.grant("c", testLayout.Partition, 7)
	_, err := g.engines[1].RegisterGrant(ctx, info.ID, 7, ra)
	require.ErrorIs(t, err, ErrNotLeader)
	require.NoError(t, g.call(func() error { _, err := e.RegisterGrant(ctx, info.ID, 7, ra); return err }))
	require.NoError(t, g.call(func() error { _, err := e.RegisterGrant(ctx, info.ID, 7, ra); return err }), "the renewal")
	var first [2]uint64
	for i := range first {
		require.NoError(t, g.call(func() (err error) { first[i], _, err = e.AllocIDs(info.ID, 7, ra, 1); return err }))
	}
	require.Equal(t, testLayout.Partition*testLayout.StripePages*64, uint32(first[0]), "the partition's first stripe")
	require.Greater(t, first[1], first[0])

	// Owner 8's grant, then owner 9's above it, both proposed before either commits; a
	// registration of owner 8's lower revision after 9's is proposed is refused on the leader.
	rb := v.grant("c", testLayout.Partition, 8)
	errs := make(chan error, 2)
	go func() { _, err := e.RegisterGrant(ctx, info.ID, 8, rb); errs <- err }()
	<-g.proposed
	rc := v.grant("c", testLayout.Partition, 9)
	go func() { _, err := e.RegisterGrant(ctx, info.ID, 9, rc); errs <- err }()
	<-g.proposed
	v.mu.Lock()
	v.keys[fmt.Sprintf("c/%d", testLayout.Partition)] = [2]uint64{8, rb} // etcd as 8's call saw it
	v.mu.Unlock()
	_, err = e.RegisterGrant(ctx, info.ID, 8, rb)
	require.ErrorIs(t, err, ErrFenced, "a grant below a proposed one")
	g.commit(math.MaxInt, func() bool { return true }) // every entry twice
	for i := range g.engines {
		g.apply(i, math.MaxInt)
	}
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	var want []string
	for i, r := range g.engines {
		r.mu.Lock()
		tb := r.tables[info.ID]
		require.Equal(t, [3]uint64{9, rc, first[1] + 64}, [3]uint64{tb.holder, tb.epoch, tb.nextID}, "engine %d", i)
		r.mu.Unlock()
		got := replicaState(t, r)
		if i == 0 {
			want = got
			continue
		}
		requireSameLines(t, want, got, fmt.Sprintf("engine %d differs from engine 0", i))
	}
}

// TestReplicatedExpiryRecheck: the apply of an expiry entry rechecks the owner against the
// applied state. Owner 7 lost its table to owner 8 and is idle past OwnerExpiry; its grant of
// a new table is proposed, and the leader's checkpoint, which sees only the applied state,
// proposes 7's expiry behind it: the grant applies first, so no engine drops 7 (its window
// stays: a retry of its last batch is still answered from it). Owner 9, idle and holding
// nothing, expires on every engine, the leader's included, and not before the entry applies.
func TestReplicatedExpiryRecheck(t *testing.T) {
	clock := &fakeClock{}
	clock.Now()
	g := newMemGroup(t, 3)
	for i := range g.engines {
		g.engines[i] = openEngine(t, Options{Dir: "db", FS: vfs.NewFaultFS(), Logger: quietLogger, Now: clock.Now, CheckpointInterval: -1,
			TxnResolveInterval: -1, OwnerExpiry: time.Hour, Proposer: &memProposer{g: g, self: i}})
		defer g.engines[i].Close()
	}
	g.changeLeader(0)
	e := g.engines[0]
	var t1, t2 base.TableInfo
	var ep [2]uint64
	require.NoError(t, g.call(func() (err error) {
		if t1, err = e.CreateTable("t1", 16); err != nil {
			return err
		}
		if t2, err = e.CreateTable("t2", 16); err != nil {
			return err
		}
		for i, owner := range []uint64{7, 9} {
			gr, err := e.Acquire(t1.ID, owner, 0)
			if err != nil {
				return err
			}
			ep[i] = gr.Epoch
			if i == 0 {
				if _, _, err := e.AllocIDs(t1.ID, owner, gr.Epoch, 1); err != nil {
					return err
				}
			}
			if _, err := e.CommitWait(&base.Batch{Owner: owner, Seq: 1, Fences: []base.Fence{{Table: t1.ID, Epoch: gr.Epoch}},
				Segments: []base.Segment{{Table: t1.ID, RowBytes: 16, Page: 0, Data: 1, Rows: make([]byte, 16)}}}); err != nil {
				return err
			}
			clock.Advance(e.LeaseDuration() + time.Second) // the next owner takes t1
		}
		_, err = e.Acquire(t1.ID, 8, 0)
		return err
	}))
	clock.Advance(time.Hour + time.Second)
	done := make(chan error, 1)
	go func() { _, err := e.Acquire(t2.ID, 7, 0); done <- err }()
	<-g.proposed
	require.NoError(t, e.Checkpoint()) // proposes the expiry of 7 and 9 behind 7's grant
	g.mu.Lock()
	require.Len(t, g.tail, 2)
	require.Equal(t, kindExpired, g.tail[1].kind)
	var named []uint64
	require.NoError(t, decodeExpiredRecord(g.tail[1].payload, func(x expiredOwner) { named = append(named, x.owner) }))
	g.mu.Unlock()
	require.Equal(t, []uint64{7, 9}, named)
	has := func(r *Engine, owner uint64) bool { // no require under mu: a failure's Close takes it
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.owners[owner] != nil
	}
	require.True(t, has(e, 9), "the leader expired an owner before the entry applied")
	g.drain()
	require.NoError(t, <-done)
	for i, r := range g.engines {
		require.True(t, has(r, 7), "engine %d dropped an owner that holds a table", i)
		require.False(t, has(r, 9), "engine %d kept an expired owner", i)
	}
	lsn, err := e.CommitWait(&base.Batch{Owner: 7, Seq: 1, Fences: []base.Fence{{Table: t1.ID, Epoch: ep[0]}},
		Segments: []base.Segment{{Table: t1.ID, RowBytes: 16, Page: 0, Data: 1, Rows: make([]byte, 16)}}})
	require.NoError(t, err, "a retry of 7's last batch, answered from its window")
	require.NotZero(t, lsn)
}
