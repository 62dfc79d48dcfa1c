package storenode

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testseed"
	"github.com/weftdb/weft/internal/vfs"
)

// Simulated power loss. Per seed, on a vfs.FaultFS (SyncAlways for three seeds in four,
// SyncNone for the fourth), a few rounds of: open; check the recovered state; set a crash
// point at a random mutating IO operation; run a random workload until it is hit (goroutines
// committing multi-row, multi-page batches with deletes, several batches in flight, while the
// main goroutine checkpoints, creates tables and grants ids and ownership); then cut the power
// with Crash(rng) (any subset of the unsynced sectors survives, unsynced directory entries are
// lost; sometimes CrashPartialEntries) and go on; sometimes the power fails again during the
// recovery that follows.
//
// What recovery must show:
//   - every acknowledged batch survived (under SyncNone: every batch acknowledged before a
//     call that syncs the WAL began), and every other batch is whole or absent: one owner's
//     batches are logged in seq order, so the recovered rows must equal the model after
//     exactly the batches 1..c, where c is the owner's recovered last seq, at least the last
//     acknowledged seq and at most the last one handed to Commit;
//   - every acknowledged table creation survived with its row size;
//   - ids granted before the crash are never granted again (the id high-water mark is at
//     least every acknowledged grant's end);
//   - epochs never repeat (a new grant's epoch is above every epoch granted before).

const powerOwner = 5

func TestPowerLoss(t *testing.T) {
	if seed, ok := testseed.Replay(t); ok {
		runPowerLoss(t, seed)
		return
	}
	seeds := testseed.Scaled(60, 300, 3000)
	base := uint64(time.Now().UnixNano())
	t.Logf("seeds %d..%d (replay one with WEFT_SEED=<seed>)", base, base+uint64(seeds)-1)
	for i := range seeds {
		runPowerLoss(t, base+uint64(i))
		if t.Failed() {
			return
		}
	}
}

// powerRun is the state of one seed's run, carried across its crashes.
type powerRun struct {
	t    *testing.T
	seed uint64
	rng  *rand.Rand
	fs   *vfs.FaultFS
	opts Options

	// The durable expectation at the start of a round.
	base     *storeModel
	baseSeq  uint64
	epochs   map[uint32]uint64 // highest epoch granted per table
	idsHi    map[uint32]uint64 // highest id granted + 1 per table
	names    int               // table names used (never reused, even if a creation was lost)
	opsRound int64             // mutating IO ops of a whole round, to place crash points

	// The round in flight, under mu.
	mu      sync.Mutex
	tables  []*modelTable
	batches map[uint64]*base.Batch // by seq, for seqs > baseSeq
	issued  uint64                 // highest seq handed to Commit
	acked   uint64                 // highest seq acknowledged
	// synced is the highest seq known durable under SyncNone: acknowledged before a call
	// that syncs the WAL began (a checkpoint, or a table creation or grant, which are
	// synced with every record before them).
	synced   uint64
	gen      batchGen
	failures []error // unexpected errors: before the crash point
}

func runPowerLoss(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x9077e7))
	r := &powerRun{
		t:        t,
		seed:     seed,
		rng:      rng,
		fs:       vfs.NewFaultFS(),
		base:     newStoreModel(),
		epochs:   make(map[uint32]uint64),
		idsHi:    make(map[uint32]uint64),
		opsRound: 300,
	}
	r.gen = batchGen{rng: rand.New(rand.NewPCG(seed, 1)), pages: 10, segsMax: 4}
	r.opts = Options{
		Dir:                "db",
		FS:                 r.fs,
		Sync:               SyncMode(seed % 4 / 3), // SyncNone for one seed in four
		CacheBytes:         []int64{MinCacheBytes, 64 << 10, 1 << 20}[rng.IntN(3)],
		CheckpointWALBytes: int64(4<<10) << rng.IntN(4),
		CheckpointInterval: -1,
		WALSegmentBytes:    int64(8<<10) << rng.IntN(3),
		Logger:             quietLogger,
	}
	chunkRng := rand.New(rand.NewPCG(seed, 2))
	rounds := 3
	for round := range rounds + 1 {
		if round > 0 && rng.IntN(3) == 0 {
			// The power fails again during recovery (which may checkpoint in the middle of
			// the replay, truncate a torn tail and rewrite the unsynced one).
			r.fs.SetCrashPoint(rng.Int64N(60))
			if e, err := Open(r.opts); err == nil {
				r.fs.SetCrashPoint(0)
				e.Close()
			}
			r.fs.Crash(rng)
		}
		if round > 0 {
			requireCheckNoDamage(t, r.fs, r.opts.Dir, fmt.Sprintf("seed %d round %d: check after power loss", seed, round))
		}
		e, err := Open(r.opts)
		require.NoError(t, err, "seed %d round %d: open after power loss", seed, round)
		// Tiny lock holds: every checkpoint crosses chunk boundaries, commits between.
		e.ckptChunk = ckptChunks{scanFrames: 1 + chunkRng.IntN(8), copyBytes: 4096 * (1 + chunkRng.IntN(3)), installWrites: 1 + chunkRng.IntN(4)}
		e.logSlack = int64(chunkRng.IntN(2)) * 4096 // the map log compacts often, or appends for a while
		r.checkRecovered(e, round)
		if round == 0 {
			r.createTable(e)
			require.Empty(t, r.failures)
		}
		if round == rounds || t.Failed() {
			require.NoError(t, e.Close())
			return
		}
		r.runRound(e)
		if t.Failed() {
			return
		}
	}
}

// checkRecovered checks a freshly opened engine against what was acknowledged, then makes the
// recovered state the base of the next round.
func (r *powerRun) checkRecovered(e *Engine, round int) {
	t := r.t
	msg := fmt.Sprintf("seed %d round %d", r.seed, round)
	var c uint64 // the owner's recovered last seq
	for _, mt := range r.base.tables {
		info := tableInfo(t, e, mt.id)
		require.GreaterOrEqual(t, info.NextID, r.idsHi[mt.id], "%s: table %d: ids granted before the crash", msg, mt.id)
		g, err := e.Acquire(mt.id, powerOwner, 0)
		require.NoError(t, err, msg)
		require.Greater(t, g.Epoch, r.epochs[mt.id], "%s: table %d: epoch granted twice", msg, mt.id)
		r.epochs[mt.id] = g.Epoch
		c = g.LastSeq
	}
	if r.opts.Sync == SyncAlways {
		require.GreaterOrEqual(t, c, r.acked, "%s: acknowledged batch lost", msg)
	} else {
		require.GreaterOrEqual(t, c, r.synced, "%s: batch before a sync lost", msg)
	}
	require.LessOrEqual(t, c, max(r.issued, r.baseSeq), "%s: batch never sent was applied", msg)
	want := r.base.clone()
	for seq := r.baseSeq + 1; seq <= c; seq++ {
		want.apply(r.batches[seq])
	}
	require.NoError(t, checkStore(e, want), "%s: recovered seq %d (acknowledged %d, sent %d)", msg, c, r.acked, r.issued)
	for _, mt := range want.tables {
		first, _, err := e.AllocIDs(mt.id, powerOwner, r.epochs[mt.id], 1)
		require.NoError(t, err, msg)
		require.GreaterOrEqual(t, first, r.idsHi[mt.id], "%s: table %d: id granted twice", msg, mt.id)
		r.idsHi[mt.id] = first + 64
		next, err := grantPages(e, mt.id, powerOwner, r.epochs[mt.id], testGrantPages)
		require.NoError(t, err, msg)
		r.idsHi[mt.id] = max(r.idsHi[mt.id], next)
	}
	r.base, r.baseSeq, r.issued, r.acked, r.synced = want, c, c, c, c
	r.batches = make(map[uint64]*base.Batch)
}

// runRound runs the workload on e until the crash point, then cuts the power.
func (r *powerRun) runRound(e *Engine) {
	r.tables = r.tables[:0]
	for _, mt := range r.base.tables {
		r.tables = append(r.tables, mt)
	}
	r.sortTables()
	r.failures = nil
	opsBefore := r.fs.Ops()
	r.fs.SetCrashPoint(r.rng.Int64N(r.opsRound*5/4 + 1))

	var wg sync.WaitGroup
	stop := make(chan struct{})
	acks := make(chan struct{}, 128)
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.committer(e, stop, acks)
		}()
	}
	committersDone := make(chan struct{})
	go func() {
		wg.Wait()
		close(committersDone)
	}()
	// One control step per few acknowledged batches, so commits dominate the IO.
control:
	for !r.fs.CrashPointReached() {
		for range 3 {
			select {
			case <-acks:
			case <-committersDone:
				break control
			}
		}
		r.control(e)
	}
	close(stop)
	<-committersDone
	if !r.fs.CrashPointReached() {
		// The workload ended first: crash now, with nothing in flight.
		r.opsRound = max(r.opsRound, r.fs.Ops()-opsBefore)
		r.fs.SetCrashPoint(0)
	}
	for _, err := range r.failures {
		r.t.Errorf("seed %d: error before the crash point: %v", r.seed, err)
	}
	e.Close() // fails: the process is dead; it only stops the goroutines
	if r.rng.IntN(4) == 0 {
		r.fs.CrashPartialEntries(r.rng)
	} else {
		r.fs.Crash(r.rng)
	}
}

func (r *powerRun) sortTables() {
	for i := 1; i < len(r.tables); i++ {
		for j := i; j > 0 && r.tables[j].id < r.tables[j-1].id; j-- {
			r.tables[j], r.tables[j-1] = r.tables[j-1], r.tables[j]
		}
	}
}

// expectCrash records err as a failure unless the crash point has passed (then every error
// is expected). It reports whether the caller should stop.
func (r *powerRun) expectCrash(err error) bool {
	if err == nil {
		return false
	}
	if !r.fs.CrashPointReached() {
		r.mu.Lock()
		r.failures = append(r.failures, err)
		r.mu.Unlock()
	}
	return true
}

// committer commits batches of the shared owner: seqs are assigned and batches handed to
// Commit under mu, so the owner's seq order is the commit order; several committers keep
// several batches in flight.
func (r *powerRun) committer(e *Engine, stop, acks chan struct{}) {
	done := make(chan error, 1)
	for range 40 {
		select {
		case <-stop:
			return
		default:
		}
		r.mu.Lock()
		if len(r.tables) == 0 {
			r.mu.Unlock()
			return
		}
		r.issued++
		seq := r.issued
		b := r.gen.next(powerOwner, seq, r.tables, r.epochs)
		r.batches[seq] = b
		e.Commit(b, func(_ uint64, err error) { done <- err })
		r.mu.Unlock()
		err := <-done
		if r.expectCrash(err) {
			return
		}
		r.mu.Lock()
		r.acked = max(r.acked, seq)
		r.mu.Unlock()
		select {
		case acks <- struct{}{}:
		default:
		}
	}
}

// control runs one step of the main goroutine: checkpoint, table creation, grants.
func (r *powerRun) control(e *Engine) {
	r.mu.Lock()
	acked := r.acked
	r.mu.Unlock()
	var ok bool
	switch p := r.rng.IntN(10); {
	case p < 4:
		ok = !r.expectCrash(e.Checkpoint())
	case p < 5:
		ok = r.createTable(e)
	case p < 8:
		ok = r.allocIDs(e)
	default:
		r.renew(e) // a renewal logs nothing
	}
	if ok {
		r.mu.Lock()
		r.synced = max(r.synced, acked)
		r.mu.Unlock()
	}
}

// createTable creates a table and takes its ownership; the committers write it from then on.
func (r *powerRun) createTable(e *Engine) (synced bool) {
	r.names++
	rowBytes := []int{8, 24, 64, 512}[r.rng.IntN(4)]
	info, err := e.CreateTable(fmt.Sprintf("t%d", r.names), rowBytes)
	if r.expectCrash(err) {
		return false
	}
	g, err := e.Acquire(info.ID, powerOwner, 0)
	if r.expectCrash(err) {
		// The table is durable, its grant may not be.
		r.mu.Lock()
		r.base.addTable(info.ID, rowBytes)
		r.mu.Unlock()
		return true
	}
	next, err := grantPages(e, info.ID, powerOwner, g.Epoch, testGrantPages)
	crashed := r.expectCrash(err)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.epochs[info.ID] = g.Epoch
	mt := r.base.addTable(info.ID, rowBytes)
	if crashed {
		return true // the table and its ownership are durable, the id grant may not be
	}
	r.idsHi[info.ID] = next
	r.tables = append(r.tables, mt)
	return true
}

func (r *powerRun) allocIDs(e *Engine) (synced bool) {
	r.mu.Lock()
	if len(r.tables) == 0 {
		r.mu.Unlock()
		return false
	}
	mt := r.tables[r.rng.IntN(len(r.tables))]
	epoch := r.epochs[mt.id]
	r.mu.Unlock()
	first, n, err := e.AllocIDs(mt.id, powerOwner, epoch, 1+r.rng.IntN(4))
	if r.expectCrash(err) {
		return false
	}
	r.mu.Lock()
	if first < r.idsHi[mt.id] {
		r.failures = append(r.failures, fmt.Errorf("table %d: id %d granted twice", mt.id, first))
	}
	r.idsHi[mt.id] = first + n
	r.mu.Unlock()
	return true
}

func (r *powerRun) renew(e *Engine) {
	r.mu.Lock()
	if len(r.tables) == 0 {
		r.mu.Unlock()
		return
	}
	mt := r.tables[r.rng.IntN(len(r.tables))]
	epoch := r.epochs[mt.id]
	r.mu.Unlock()
	_, err := e.Acquire(mt.id, powerOwner, epoch)
	r.expectCrash(err)
}
