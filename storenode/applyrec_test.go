package storenode

import (
	"context"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
)

// TestReplayEqualsLive: one engine takes a few hundred random operations that log every
// record kind (tables created and dropped, id and ownership grants local and from etcd,
// commits, two-phase prepares, decisions, applies, reports, forgets, a move's states and
// writes and its activation), never checkpointing; then it is killed (kill -9: the WAL as
// written, every record of it replayed at the reopen) and reopened. The reopened engine must
// hold exactly what the live one held: the meta a checkpoint would write (catalog, grants,
// next ids, the dedup table), every row, the transactions' parts, locks and decisions, the
// move states. Replay applies records with applyRecord, the live paths with the kinds'
// apply functions (applyrec.go): a kind whose two differ fails here.
//
// WEFT_REPLAY_SEED=n replays one seed (printed on failure).
func TestReplayEqualsLive(t *testing.T) {
	seeds := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	if testing.Short() {
		seeds = seeds[:3]
	}
	if s := os.Getenv("WEFT_REPLAY_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
		seeds = []uint64{n}
	}
	kinds := map[byte]int{}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			for k, n := range runReplayEqualsLive(t, seed, 800) {
				kinds[k] += n
			}
		})
	}
	for _, k := range []byte{kindCreateTable, kindCreateClusterTable, kindDropTable, kindGrantIDs, kindGrantOwner, kindCommit,
		kindTxnPrepare, kindTxnDecide, kindTxnReported, kindTxnApply, kindTxnForgot, kindMoveState} {
		require.NotZero(t, kinds[k], "seeds %v: no record of kind %d logged (the runs must cover every kind)", seeds, k)
	}
}

// replayRun is one run of TestReplayEqualsLive: an engine on a FaultFS, its collaborators in
// memory, and the random source.
type replayRun struct {
	t      *testing.T
	rnd    *rand.Rand
	fs     *vfs.FaultFS
	opts   Options
	e      *Engine
	v      *memVerifier
	leases *memLeases
	peers  *memPeers
	ids    []base.TxnID
	kinds  map[byte]int // records logged, by kind (the run must cover them)
	names  int
	src    uint32 // the move's source: a cluster table of partition 0, registered by etcd
	dst    uint32 // the move's target copy: a cluster table of partition 1
	srcN   int    // the partitioned table names of src and dst: m<n>
	dstN   int
	mover  uint64 // the target's mover epoch
}

var replayOwners = []uint64{101, 102, 103}

var replayLayout = base.ClusterLayout{Partitions: 2, StripePages: 1}

// runReplayEqualsLive runs one seed of steps operations and returns the records it logged by
// kind.
func runReplayEqualsLive(t *testing.T, seed uint64, steps int) map[byte]int {
	r := &replayRun{t: t, rnd: rand.New(rand.NewPCG(seed, seed^0x5eed)), fs: vfs.NewFaultFS(), v: newMemVerifier(),
		leases: &memLeases{}, peers: &memPeers{}, kinds: map[byte]int{}, mover: 1}
	clock := &fakeClock{}
	clock.Now() // fixed from here: nothing expires in memory only (aborts, owners, leases)
	r.opts = Options{Dir: "db", FS: r.fs, Logger: quietLogger, Now: clock.Now, CheckpointInterval: -1, TxnResolveInterval: -1,
		GrantVerifier: r.v, LeaseChecker: r.leases, TxnPeer: r.peers, Sync: SyncAlways}
	r.e = openEngine(t, r.opts)
	defer func() { r.e.Close() }()
	r.peers.set("self", r.e)
	for i := range 24 {
		r.ids = append(r.ids, base.TxnID{0: 0xa7, 14: byte(seed), 15: byte(i)})
	}
	for range 2 {
		r.createLocal()
	}
	r.newSource()
	r.newTarget()

	ops := []struct {
		weight int
		fn     func()
	}{
		{20, r.commit}, {4, r.acquire}, {2, r.release}, {4, r.allocIDs}, {2, r.createLocal}, {1, r.drop},
		{8, r.prepare}, {5, r.decide}, {5, r.apply}, {3, r.report}, {2, r.ask}, {3, r.resolve}, {1, r.killLease},
		{2, r.registerSource}, {4, r.move},
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
		require.NoError(t, r.e.failure(), "seed %d step %d: the engine failed", seed, step)
	}
	r.e.mu.Lock()
	ckpt, last := r.e.ckptLSN, r.e.lastLSN
	r.e.mu.Unlock()
	require.Zero(t, ckpt, "seed %d: a checkpoint ran: its records would not be replayed", seed)
	require.NoError(t, r.e.waitDurable(last), "seed %d", seed) // the forgot records are not forced
	t.Logf("seed %d: records by kind %v, last LSN %d", seed, r.kinds, last)
	live := captureReplayState(t, r.e)

	r.fs.CrashKeepAll() // kill -9: what was written stays, nothing more
	r.e.Close()
	r.e = openEngine(t, r.opts)
	r.peers.set("self", r.e)
	r.e.mu.Lock()
	replayed := r.e.lastLSN
	r.e.mu.Unlock()
	require.Equal(t, last, replayed, "seed %d: replay did not reach the live engine's last record", seed)
	requireSameLines(t, live, captureReplayState(t, r.e), fmt.Sprintf("seed %d: replayed state differs from the live one", seed))
	return r.kinds
}

// logged counts a record of kind if the engine's last LSN moved past before.
func (r *replayRun) logged(kind byte, before uint64) {
	r.e.mu.Lock()
	if r.e.lastLSN > before {
		r.kinds[kind]++
	}
	r.e.mu.Unlock()
}

func (r *replayRun) lastLSN() uint64 {
	r.e.mu.Lock()
	defer r.e.mu.Unlock()
	return r.e.lastLSN
}

// localTables returns the ids of the live local tables, ascending.
func (r *replayRun) localTables() []uint32 {
	var ids []uint32
	for _, ti := range r.e.Tables() {
		if !ti.Cluster.IsCluster() {
			ids = append(ids, ti.ID)
		}
	}
	return ids
}

// grantOf returns table id's holder, epoch and next id, and the holder's last seq.
func (r *replayRun) grantOf(id uint32) (holder, epoch, nextID, seq uint64, ok bool) {
	r.e.mu.Lock()
	defer r.e.mu.Unlock()
	tb := r.e.tables[id]
	if tb == nil {
		return 0, 0, 0, 0, false
	}
	if o := r.e.owners[tb.holder]; o != nil {
		seq = o.lastSeq
	}
	return tb.holder, tb.epoch, tb.nextID, seq, true
}

func (r *replayRun) pickTable() (uint32, bool) {
	ids := append(r.localTables(), r.src)
	return ids[r.rnd.IntN(len(ids))], len(ids) > 0
}

func (r *replayRun) owner() uint64 { return replayOwners[r.rnd.IntN(len(replayOwners))] }

func (r *replayRun) createLocal() {
	before := r.lastLSN()
	r.names++
	_, err := r.e.CreateTable(fmt.Sprintf("t%d", r.names), 8*(1+r.rnd.IntN(16)))
	require.NoError(r.t, err)
	r.logged(kindCreateTable, before)
}

func (r *replayRun) drop() {
	ids := r.localTables()
	if len(ids) <= 1 {
		return
	}
	id := ids[r.rnd.IntN(len(ids))]
	holder, _, _, _, _ := r.grantOf(id)
	before := r.lastLSN()
	if err := r.e.DropTable(tableInfo(r.t, r.e, id).Name, holder); err == nil {
		r.logged(kindDropTable, before)
	}
}

func (r *replayRun) acquire() {
	ids := r.localTables()
	if len(ids) == 0 {
		return
	}
	before := r.lastLSN()
	if _, err := r.e.Acquire(ids[r.rnd.IntN(len(ids))], r.owner(), 0); err == nil {
		r.logged(kindGrantOwner, before)
	}
}

// release ends a holder's lease at once, so another owner's Acquire takes the table.
func (r *replayRun) release() {
	ids := r.localTables()
	if len(ids) == 0 {
		return
	}
	id := ids[r.rnd.IntN(len(ids))]
	if holder, epoch, _, _, ok := r.grantOf(id); ok && holder != 0 {
		_ = r.e.Release(id, holder, epoch)
	}
}

// clusterTable creates partition p of table m<n> (n: the next name), of layout replayLayout.
func (r *replayRun) clusterTable(p uint32) (uint32, int) {
	r.names++
	l := replayLayout
	l.Partition = p
	before := r.lastLSN()
	ti, err := r.e.CreateClusterTable(base.PartitionTableName(fmt.Sprintf("m%d", r.names), p), 64, l)
	require.NoError(r.t, err)
	r.logged(kindCreateClusterTable, before)
	return ti.ID, r.names
}

// newSource makes a new cluster table the move's source (the last one was retired) and
// registers a grant of it.
func (r *replayRun) newSource() {
	r.src, r.srcN = r.clusterTable(0)
	r.registerSource()
}

// newTarget makes a new cluster table the move's target (the last one was activated).
func (r *replayRun) newTarget() {
	r.dst, r.dstN = r.clusterTable(1)
	r.mover++
}

// registerSource registers a new etcd grant of the move's source to a random owner.
func (r *replayRun) registerSource() {
	owner := r.owner()
	epoch := r.v.grant(fmt.Sprintf("m%d", r.srcN), 0, owner)
	before := r.lastLSN()
	if _, err := r.e.RegisterGrant(context.Background(), r.src, owner, epoch); err == nil {
		r.logged(kindGrantOwner, before)
	}
}

func (r *replayRun) allocIDs() {
	id, ok := r.pickTable()
	if !ok {
		return
	}
	holder, epoch, _, _, ok := r.grantOf(id)
	if !ok || holder == 0 {
		return
	}
	before := r.lastLSN()
	if _, _, err := r.e.AllocIDs(id, holder, epoch, 1+r.rnd.IntN(2)); err == nil {
		r.logged(kindGrantIDs, before)
	}
}

// segment returns a random segment of table id (row size rowBytes) on a granted page: rows
// set and rows cleared.
func (r *replayRun) segment(id uint32, rowBytes int, nextID uint64) (base.Segment, bool) {
	if nextID == 0 {
		return base.Segment{}, false
	}
	page := r.rnd.Uint64N((nextID + logicpage.RowsPerPage - 1) / logicpage.RowsPerPage)
	granted := ^uint64(0)
	if first := page * logicpage.RowsPerPage; nextID-first < logicpage.RowsPerPage {
		granted = 1<<(nextID-first) - 1
	}
	if id == r.src {
		// A cluster table's ids are its partition's stripes: write its page's granted ids
		// only where AllocIDs granted them (every id of a stripe page below nextID is).
		l := replayLayout
		if l.PartitionOfPage(page) != 0 {
			return base.Segment{}, false
		}
	}
	data := r.rnd.Uint64() & granted
	clear := r.rnd.Uint64() & granted &^ data & r.rnd.Uint64()
	if data|clear == 0 {
		data = 1 & granted
	}
	rows := make([]byte, bits.OnesCount64(data)*rowBytes)
	for i := range rows {
		rows[i] = byte(r.rnd.Uint32())
	}
	return base.Segment{Table: id, Page: page, Data: data, Clear: clear, Rows: rows}, true
}

// batch returns a batch of the holder of a random table, its next seq, or nil.
func (r *replayRun) batch() *base.Batch {
	id, ok := r.pickTable()
	if !ok {
		return nil
	}
	holder, epoch, nextID, seq, ok := r.grantOf(id)
	if !ok || holder == 0 {
		return nil
	}
	rowBytes := tableInfo(r.t, r.e, id).RowBytes
	b := &base.Batch{Owner: holder, Seq: seq + 1, Fences: []base.Fence{{Table: id, Epoch: epoch}}}
	for range 1 + r.rnd.IntN(3) {
		s, ok := r.segment(id, rowBytes, nextID)
		if ok && !slices.ContainsFunc(b.Segments, func(o base.Segment) bool { return o.Page == s.Page }) {
			b.Segments = append(b.Segments, s)
		}
	}
	if len(b.Segments) == 0 {
		return nil
	}
	return b
}

func (r *replayRun) commit() {
	if b := r.batch(); b != nil {
		before := r.lastLSN()
		if _, err := r.e.CommitWait(b); err == nil {
			r.logged(kindCommit, before)
		}
	}
}

func (r *replayRun) txnID() base.TxnID { return r.ids[r.rnd.IntN(len(r.ids))] }

func (r *replayRun) prepare() {
	b := r.batch()
	if b == nil {
		return
	}
	primary := []string{"", "self", "gone:1"}[r.rnd.IntN(3)]
	before := r.lastLSN()
	if _, err := r.e.PrepareTxn(&base.TxnPrepare{Txn: r.txnID(), Lease: int64(1 + r.rnd.IntN(3)), Primary: primary,
		Index: uint16(r.rnd.IntN(3)), Batch: b}); err == nil {
		r.logged(kindTxnPrepare, before)
	}
}

func (r *replayRun) decision() base.Decision {
	return []base.Decision{base.DecisionCommit, base.DecisionAbort}[r.rnd.IntN(2)]
}

// decide decides a random id. Not a Decide that would teach a decision recorded without a
// count its count (learnCount): that is memory only, carried by a checkpoint, not logged, so
// a kill forgets it (txn_forget.go says so; a replicated store must log it).
func (r *replayRun) decide() {
	id, d, count := r.txnID(), r.decision(), []int{0, 1, 2, 3, 64}[r.rnd.IntN(5)]
	r.e.mu.Lock()
	rec := r.e.txnDecisions[id]
	learns := rec != nil && rec.count == 0 && count > 0
	r.e.mu.Unlock()
	if learns {
		return
	}
	before := r.lastLSN()
	if _, err := r.e.DecideTxn(context.Background(), id, int64(1+r.rnd.IntN(3)), d, count); err == nil {
		r.logged(kindTxnDecide, before)
	}
}

// apply applies a decision to a prepared part (mostly) or to a random id.
func (r *replayRun) apply() {
	id := r.txnID()
	r.e.mu.Lock()
	if r.rnd.IntN(4) > 0 {
		for kept, p := range r.e.txnParts {
			if p.decision == base.DecisionNone {
				id = kept
				break
			}
		}
	}
	r.e.mu.Unlock()
	before := r.lastLSN()
	if err := r.e.ApplyTxn(id, r.decision()); err == nil {
		r.logged(kindTxnApply, before)
	}
}

// report reports a participant of a kept decision's id (mostly) or of a random id.
func (r *replayRun) report() {
	id := r.txnID()
	r.e.mu.Lock()
	if r.rnd.IntN(4) > 0 {
		for kept := range r.e.txnDecisions {
			id = kept
			break
		}
	}
	r.e.mu.Unlock()
	before := r.lastLSN()
	if err := r.e.ReportTxn(id, uint16(r.rnd.IntN(3))); err == nil {
		r.logged(kindTxnReported, before)
	}
}

func (r *replayRun) ask() {
	before := r.lastLSN()
	if _, err := r.e.AskTxn(context.Background(), r.txnID(), int64(1+r.rnd.IntN(3))); err == nil {
		r.logged(kindTxnDecide, before)
	}
}

// resolve runs a resolver pass: parts of primary "self" ask this engine and report to it;
// the parts whose reports were acknowledged are forgotten (a forgot record).
func (r *replayRun) resolve() {
	applied := r.decidedParts()
	before := r.lastLSN()
	_ = r.e.ResolveTxns(context.Background())
	if r.decidedParts() < applied {
		r.logged(kindTxnForgot, before)
	}
}

// decidedParts counts the engine's transaction parts with a decision applied.
func (r *replayRun) decidedParts() int {
	r.e.mu.Lock()
	defer r.e.mu.Unlock()
	n := 0
	for _, p := range r.e.txnParts {
		if p.decision != base.DecisionNone {
			n++
		}
	}
	return n
}

func (r *replayRun) killLease() { r.leases.kill(int64(1 + r.rnd.IntN(3))) }

// move takes one random step of a move: the target copy begun, written, activated; the
// source marked, frozen, thawed, retired. Most are refused in the state they find; the run
// goes on.
func (r *replayRun) move() {
	before := r.lastLSN()
	var err error
	switch r.rnd.IntN(7) {
	case 0:
		if r.rnd.IntN(3) == 0 {
			r.mover++
		}
		err = r.e.MoveBegin(r.dst, r.mover)
	case 1, 2:
		var segs []base.Segment
		for range 1 + r.rnd.IntN(2) {
			page := uint64(1 + 2*r.rnd.IntN(4)) // the target's partition: odd pages
			if s, ok := r.segment(r.dst, 64, (page+1)*logicpage.RowsPerPage); ok && s.Page == page {
				segs = append(segs, s)
			} else {
				segs = append(segs, base.Segment{Table: r.dst, Page: page, Data: 1, Rows: make([]byte, 64)})
			}
		}
		if len(segs) == 2 && segs[0].Page == segs[1].Page {
			segs = segs[:1]
		}
		_, err = r.e.MoveWrite(segs, r.mover)
		if err == nil {
			r.logged(kindCommit, before)
		}
		return
	case 3:
		err = r.e.MoveActivate(r.dst, r.mover, r.v.grant(fmt.Sprintf("m%d", r.dstN), 1, 0), uint64(8+r.rnd.IntN(4))*logicpage.RowsPerPage)
		if err == nil {
			r.logged(kindGrantOwner, before)
			r.newTarget()
		}
		return
	case 4:
		_, _ = r.e.MoveMark(r.src)
		_, err = r.e.MoveFreeze(r.src, r.mover)
	case 5:
		err = r.e.MoveThaw(r.src, r.mover)
	case 6:
		if err = r.e.MoveRetire(r.src, r.mover); err == nil {
			r.logged(kindMoveState, before)
			r.newSource()
		}
		return
	}
	if err == nil {
		r.logged(kindMoveState, before)
	}
}

// captureReplayState renders what TestReplayEqualsLive compares, a line per item, sorted:
// everything the records make, none of the soft state (leases, incarnations, times, resolver
// backoff, move marks).
func captureReplayState(t *testing.T, e *Engine) []string {
	t.Helper()
	var lines []string
	add := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	e.mu.Lock()
	// An abort every participant reported is forgotten by the next sweep on both: the live
	// one may have swept it already, a replay only queued it.
	e.sweepTxnDecisions()
	add("last LSN %d", e.lastLSN)
	meta := encodeMeta(e.snapshotMeta()) // catalog, grants, next ids, the dedup table
	add("meta %d bytes, xxhash %x", len(meta), xxhash.Sum64(meta))
	for _, tb := range e.dropped {
		add("dropped %d %s at %d", tb.id, tb.name, tb.dropLSN)
	}
	for id, p := range e.txnParts {
		add("part %x: decision %v primary %q index %d lease %d hash %x lsn %d owner %d seq %d fences %v segments %s rec %x",
			id, p.decision, p.primary, p.index, p.lease, p.hash, p.lsn, p.batch.Owner, p.batch.Seq, p.batch.Fences,
			replaySegments(p.batch.Segments), xxhash.Sum64(p.rec))
	}
	for id, d := range e.txnDecisions {
		add("decision %x: %v count %d lease %d reported %#x lsn %d owner %d", id, d.d, d.count, d.lease, d.reported, d.lsn, d.owner)
	}
	for id, f := range e.txnForgot {
		add("forgotten %x: %v", id, f.d)
	}
	for k, m := range e.txnLocks {
		add("lock %x: %#x", k, m)
	}
	for id, n := range e.txnTables {
		add("locked table %d: %d", id, n)
	}
	for o, u := range e.txnOwners {
		add("owner %d prepared %d bytes %d", o, u.parts, u.bytes)
	}
	for o, n := range e.txnDecisionOwners {
		add("owner %d decisions %d", o, n)
	}
	add("prepared %d bytes %d", e.txnPrepared, e.txnBytes)
	for id, m := range e.moves {
		if m.state != MoveLive { // a live table's entry holds a mark or a drain: memory only
			add("move %d: %v epoch %d", id, m.state, m.epoch)
		}
	}
	tables := make(map[uint32]uint64, len(e.tables))
	for id, tb := range e.tables {
		tables[id] = tb.nextID
	}
	e.mu.Unlock()
	for id, nextID := range tables {
		for page := range (nextID + logicpage.RowsPerPage - 1) / logicpage.RowsPerPage {
			data, _, rows, err := e.ReadRows(id, page, ^uint64(0), nil)
			add("rows %d page %d: %#x, xxhash %x, %v", id, page, data, xxhash.Sum64(rows), err)
		}
	}
	slices.Sort(lines)
	return lines
}

// replaySegments renders segments with their rows' hashes.
func replaySegments(segs []base.Segment) string {
	var b strings.Builder
	for _, s := range segs {
		fmt.Fprintf(&b, "{table %d page %d data %#x clear %#x rows %x} ", s.Table, s.Page, s.Data, s.Clear, xxhash.Sum64(s.Rows))
	}
	return b.String()
}

// requireSameLines fails with the lines only one of live and replayed has (at most 20 each).
func requireSameLines(t *testing.T, live, replayed []string, msg string) {
	t.Helper()
	in := func(lines []string, l string) bool { _, ok := slices.BinarySearch(lines, l); return ok }
	var diff []string
	for _, l := range live {
		if !in(replayed, l) && len(diff) < 20 {
			diff = append(diff, "- live only:     "+l)
		}
	}
	for _, l := range replayed {
		if !in(live, l) && len(diff) < 40 {
			diff = append(diff, "+ replayed only: "+l)
		}
	}
	if len(diff) > 0 || len(live) != len(replayed) {
		t.Fatalf("%s:\n%s", msg, strings.Join(diff, "\n"))
	}
}
