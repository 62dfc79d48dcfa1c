package txnode

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/txnode/store"
)

// The commit pipeline turns committed transactions into commit batches.
//
// Durable: a committing transaction copies its rows, once, into the open batch's own buffer
// (under mu, where it also takes its commit version, so batches cover increasing ranges of
// versions) and records, in the flight record of each frame it touched, the rows and the
// version (pageCache.markFlight). One sender goroutine takes the open batch whenever it wakes,
// after yielding once so that concurrent commits can join (group commit), numbers it with the
// owner's next seq and sends it; up to inflightMax batches are in flight, holding at most
// Options.InflightBytes (a commit waits, honouring its context, for room). The store
// acknowledges batches; they complete in seq order, which advances the node's durable version
// and then the cache's settled version.
//
// A batch needs its frames only until its rows are copied: after that the frames may be
// evicted (the cache leaves a ghost, and a fetch of a ghost row waits for the batch to
// settle: see cache.go). A batch keeps a reference to each frame with its page's key, to
// invalidate the frame's rows if it fails, only if the frame still holds the same page.
//
// WriteBack: commits only mark rows dirty in their frames. A flusher takes, every FlushInterval
// or when the cache needs room, a consistent cut (it excludes installs for the time of the cut)
// of all dirty rows into one batch: repeated writes to a row and rows of a page coalesce.
//
// Outage (a remote store, remotestore.go): no batch fails for it. Batches in flight stay in
// flight and are resent on reconnect; once the storage node has been unreachable for
// RequestTimeout, commits are refused at admission with ErrUnavailable (nothing applied), and
// the waits for batches in flight end (a committer gets ErrUnknownOutcome, a reader
// ErrUnavailable, Close gives up on them as when its context ends).
//
// Failure: a batch that fails makes the pipeline fail-stop; every later batch fails too, the
// frames they touched are invalidated (their rows are fetched from the store again) and every
// later commit returns the error wrapped. WriteBack: the flusher cuts once more at once, and
// that cut, not sent, invalidates the frames of the rows installed since the failed epoch.
// Reopen the DB to go on. Except (Durable): a batch the store refused as fenced or naming a
// table it does not have fails the commits not acknowledged and the pipeline goes on
// (recover.go).
//
// A batch's buffer is never written after the batch is handed to the store, until it is
// acknowledged or failed (the store's gather encoder sends straight from it).
//
// Batches are reused, so a commit allocates nothing. Nothing outside the pipeline holds a
// batch: a committer waits for the node's durable version to reach its commit version
// (DB.waitDurable), which batches retired in seq order advance. A batch is reused only when
// it is retired and the store is done with it: done was called and Commit has returned (a
// store may call done before its Commit returns).

const (
	batchBytesMax = 1 << 20
	inflightMax   = 8
	// batchFreeMax bounds the retired batches kept for reuse; batchKeepBytes and
	// batchKeepSegs bound what a kept batch may hold on to, so a burst of large batches does
	// not keep their memory.
	batchFreeMax   = inflightMax + 1
	batchKeepBytes = 256 << 10
	batchKeepSegs  = 4096
)

type batch struct {
	seq      uint64
	firstVer uint64
	lastVer  uint64
	nTx      int
	buf      []byte
	segs     []base.Segment // Rows are set at send time (buf may move while it fills)
	segOff   []int
	tables   []*tableState
	frames   []frameRef
	commit   store.Batch
	// done is the store's callback for this batch, made once with the batch.
	done func(lsn uint64, err error)

	completed bool // done was called
	returned  bool // the store's Commit returned
	retired   bool // completed and taken off inflight, in seq order
	// held: in flight after a refused batch: its committers are answered when it retires
	// (holdLaterLocked, answerHeldLocked in recover.go).
	held bool
	err  error
	lsn  uint64
	gen  uint64 // the store's connection when it was sent (connGen)
}

type pipeline struct {
	db *DB

	mu       sync.Mutex
	room     *sync.Cond
	open     *batch
	inflight []*batch
	free     []*batch // retired batches to reuse, at most batchFreeMax
	nextSeq  uint64
	failErr  error
	failVer  uint64 // firstVer of the earliest failed batch; max when none
	closing  bool
	stopped  atomic.Bool // failErr != nil || closing, for WriteBack's lock-free admission

	// launchedSeq is the seq of the batch launched last, retiredSeq and retiredVer the seq and
	// the last version of the batch retired last: batches launch and retire in increasing seq
	// order, and their versions increase with their seqs (asserted in launchLocked and
	// complete). A recovery lowers both seqs, with nothing in flight, to reuse the refused seq
	// (recover.go); versions are never reused.
	launchedSeq uint64
	retiredSeq  uint64
	retiredVer  uint64

	// flightBytes is what the open batch and the batches in flight hold (batchCost), at most
	// flightMax (Options.InflightBytes) but for one transaction admitted alone.
	flightBytes int64
	flightMax   int64
	// aloneWaiters: commits larger than flightMax waiting for nothing to be in flight; while
	// there are any, no other commit is admitted (add).
	aloneWaiters int
	// unsentVer is the highest version of a batch dropped unsent after a failure: it settles
	// once the batches in flight before it have.
	unsentVer uint64
	abandoned bool // close gave up on the batches in flight: they may never settle
	// prepHold: a two-phase commit's prepare holds the owner's next seq (prepare.go): no
	// batch is launched until the storage node answered it.
	prepHold bool
	// rec is the recovery from a refused batch in progress (recover.go); nil when none.
	// While it is set no commit is admitted and no batch launched.
	rec *recovery
	// installing counts the commits add gave a version that have not installed yet
	// (Durable): a recovery waits for them before its last invalidation.
	installing atomic.Int64
	recovering atomic.Bool // rec != nil, for addDone

	kick     chan struct{}
	flushReq chan struct{}
	// cutReq (WriteBack): flush's requests for a cut, which the flusher makes and answers
	// with its version. The flusher, not flush's caller, may wait for room in flight (no
	// context): the caller waits only as long as its context allows.
	cutReq chan chan uint64
	stop   chan struct{}
	bg     sync.WaitGroup

	// WriteBack.
	// flushMu makes flushEpoch one at a time, from its cut to the store's Commit: the
	// flusher, flush (DropTable, Close) and the cache's requests may all call it, and an
	// epoch must get its seq, and reach the store, in the order of its cut.
	flushMu    sync.Mutex
	wbMu       sync.RWMutex // installs (R) against the flusher's cut (W)
	dirtyMu    sync.Mutex
	dirty      []*frameMeta
	dirtySpare []*frameMeta // the last cut's slice, reused (under wbMu)
	cutVer     uint64       // the last cut's commit version (under wbMu)
	dirtyRows  atomic.Int64
	// dirtyBytes is what the frames made dirty since the last cut cost in the cache: a
	// flush starts when they fill a quarter of it (a few rows dirty each of many pages
	// block eviction as much as full pages).
	dirtyBytes atomic.Int64
	// dirtyRowBytes is the row bytes made dirty since the last cut, about what the next epoch
	// ships: commits wait while it exceeds epochBytesMax, so an epoch stays within what the
	// store takes in one batch even when the flusher is slow to run.
	dirtyRowBytes atomic.Int64
}

// epochBytesMax bounds the rows of one WriteBack epoch: half the store's batch limit.
func (p *pipeline) epochBytesMax() int64 {
	if n := p.db.info.MaxBatchBytes; n > 0 {
		return int64(n) / 2
	}
	return 8 << 20
}

func newPipeline(db *DB) *pipeline {
	p := &pipeline{db: db, nextSeq: 1, failVer: math.MaxUint64, flightMax: db.opts.InflightBytes,
		kick: make(chan struct{}, 1), flushReq: make(chan struct{}, 1), cutReq: make(chan chan uint64),
		stop: make(chan struct{})}
	p.room = sync.NewCond(&p.mu)
	p.open = p.newBatchLocked()
	p.bg.Add(1)
	go p.sender()
	if db.opts.Durability == WriteBack {
		p.bg.Add(1)
		go p.flusher()
	}
	return p
}

func (p *pipeline) noteLastSeq(seq uint64) {
	p.mu.Lock()
	p.nextSeq = max(p.nextSeq, seq+1)
	p.mu.Unlock()
}

func (p *pipeline) failure() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failErr
}

// admitErr is why no commit may be added now: the pipeline failed or is closing. Caller
// holds mu.
func (p *pipeline) admitErr() error {
	if p.failErr != nil {
		return p.failErr
	}
	if p.closing {
		return ErrClosed
	}
	// The storage node unavailable: refused before anything is applied (its batch would
	// wait out the outage in flight).
	return p.db.unavailableErr()
}

// wakeRoom wakes the waiters on room: the remote store became unavailable (admitErr, close).
func (p *pipeline) wakeRoom() {
	p.mu.Lock()
	p.room.Broadcast()
	p.mu.Unlock()
}

// newBatchLocked returns an empty batch, a reused one when there is one. Caller holds mu.
func (p *pipeline) newBatchLocked() *batch {
	if n := len(p.free); n > 0 {
		b := p.free[n-1]
		p.free[n-1] = nil
		p.free = p.free[:n-1]
		return b
	}
	b := &batch{}
	b.done = func(lsn uint64, err error) { p.complete(b, lsn, commitError(err)) }
	return b
}

// recycleLocked keeps b for reuse once nothing refers to it any more: it is retired and the
// store is done with it. Caller holds mu.
func (p *pipeline) recycleLocked(b *batch) {
	// - Every batch that leaves the open slot or flight gives back its cost: what is counted
	//   never goes below zero.
	assert.That(p.flightBytes >= 0, "txnode: in-flight bytes below zero")
	if !b.retired || !b.returned {
		return
	}
	if len(p.free) >= batchFreeMax || cap(b.buf) > batchKeepBytes || cap(b.segs) > batchKeepSegs {
		return
	}
	clear(b.segs)
	clear(b.tables)
	clear(b.frames)
	*b = batch{buf: b.buf[:0], segs: b.segs[:0], segOff: b.segOff[:0], tables: b.tables[:0],
		frames: b.frames[:0], commit: store.Batch{Fences: b.commit.Fences[:0]}, done: b.done}
	p.free = append(p.free, b)
	// - The free list is bounded (batchFreeMax).
	assert.That(len(p.free) <= batchFreeMax, "txnode: free commit batches over their bound")
}

func (p *pipeline) kickNow() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *pipeline) flushSoon() {
	select {
	case p.flushReq <- struct{}{}:
	default:
	}
}

// closeTable closes t to new commits (or opens it again): add refuses a transaction that
// writes t once closeTable returns. Durable: add checks under mu, where it also takes its
// version, so a flush after this waits for every commit admitted before. WriteBack: add
// checks under wbMu (read), so the next cut waits for every install admitted before.
func (p *pipeline) closeTable(t *tableState, closed bool) {
	p.mu.Lock()
	t.dropping.Store(closed)
	p.mu.Unlock()
}

// droppingErr is ErrTableNotFound for a transaction that writes a table being dropped.
func droppingErr(tx *Tx) error {
	var last *tableState
	for i := range tx.writes {
		if t := tx.writes[i].t; t != last {
			if t.dropping.Load() {
				return fmt.Errorf("%w: %q is being dropped", ErrTableNotFound, t.name)
			}
			last = t
		}
	}
	return nil
}

// add gives a validated, locked transaction its commit version and (Durable) copies its rows
// into the open batch. In WriteBack it returns holding wbMu for reading; addDone releases it.
// A transaction whose context is done by then is refused with ctx.Err(): nothing applied.
func (p *pipeline) add(tx *Tx) (uint64, error) {
	db := p.db
	if db.opts.Durability == WriteBack {
		if p.dirtyRowBytes.Load() > p.epochBytesMax() {
			p.mu.Lock()
			err := p.waitRoomLocked(tx.ctx, func() bool {
				if p.dirtyRowBytes.Load() <= p.epochBytesMax() || p.admitErr() != nil {
					return true
				}
				p.flushSoon()
				return false
			})
			p.mu.Unlock()
			if err != nil {
				return 0, err
			}
		}
		p.wbMu.RLock()
		// Closing: close's last cut may be past, so nothing would flush this commit. close
		// sets stopped before that cut takes wbMu, which waits for this install.
		if p.stopped.Load() {
			p.mu.Lock()
			err := p.admitErr()
			p.mu.Unlock()
			p.wbMu.RUnlock()
			return 0, err
		}
		if err := droppingErr(tx); err != nil {
			p.wbMu.RUnlock()
			return 0, err
		}
		if err := db.unavailableErr(); err != nil {
			p.wbMu.RUnlock()
			return 0, err // the storage node unavailable (admitErr)
		}
		// The last moment to give up: from here on the transaction is installed.
		if err := tx.ctx.Err(); err != nil {
			p.wbMu.RUnlock()
			return 0, err
		}
		return db.commitVer.Add(1), nil
	}
	need := txFlightBytes(tx, db.opts.FullPageIO) // bounded before the copy
	// One larger than the bound waits for nothing in flight; meanwhile no other commit is
	// admitted (aloneWaiters), or a steady stream of small ones would keep it out for ever.
	alone := need > p.flightMax
	p.mu.Lock()
	if alone {
		p.aloneWaiters++
	}
	waitedRec := false
	err := p.waitRoomLocked(tx.ctx, func() bool {
		if p.admitErr() != nil {
			return true
		}
		if p.rec != nil {
			waitedRec = true
			return false
		}
		fits := p.flightBytes == 0
		if !alone {
			fits = p.aloneWaiters == 0 && (fits || p.flightBytes+need <= p.flightMax)
		}
		if len(p.open.buf) < batchBytesMax && fits {
			return true
		}
		p.kickNow()
		return false
	})
	if alone {
		p.aloneWaiters--
		p.room.Broadcast() // the commits that waited behind it
	}
	if err == nil {
		err = p.admitErr()
	}
	if err == nil {
		err = droppingErr(tx)
	}
	if err == nil && waitedRec {
		// A table fenced by the refusal is latched now: its transaction fails here, not
		// in the next refused batch.
		err = tx.leasesLive()
	}
	if err == nil && p.db.failHi.Load() != 0 {
		err = tx.readFailed()
	}
	if err != nil {
		p.mu.Unlock()
		return 0, err
	}
	// The last moment to give up: from here on the transaction is in a batch, and installed.
	if err := tx.ctx.Err(); err != nil {
		p.mu.Unlock()
		return 0, err
	}
	ver := db.commitVer.Add(1)
	b := p.open
	if b.nTx == 0 {
		b.firstVer = ver
	}
	b.lastVer = ver
	b.nTx++
	before := batchCost(b)
	p.appendTx(b, tx, ver)
	p.flightBytes += batchCost(b) - before
	p.installing.Add(1)
	p.mu.Unlock()
	p.kickNow()
	return ver, nil
}

// segFlightBytes is what a page segment of a batch in flight costs beside its rows: the
// segment, its offset, its frame reference and, should the frame be evicted, its ghost.
const segFlightBytes = int64(unsafe.Sizeof(base.Segment{})+unsafe.Sizeof(frameRef{})) + 8 + 32

// batchCost is what b counts against the in-flight bound.
func batchCost(b *batch) int64 { return int64(len(b.buf)) + int64(len(b.segs))*segFlightBytes }

// flightBytesLocked recounts flightBytes: the cost of the open batch and of the batches in
// flight. Caller holds mu.
func (p *pipeline) flightBytesLocked() int64 {
	n := batchCost(p.open)
	for _, b := range p.inflight {
		n += batchCost(b)
	}
	return n
}

// txFlightBytes is at least what appendTx adds to a batch's cost for tx (whole pages under
// FullPageIO). tx.writes are sorted.
func txFlightBytes(tx *Tx, fullPages bool) int64 {
	var n int64
	var last *frameMeta
	for i := range tx.writes {
		w := &tx.writes[i]
		if w.m != last {
			n += segFlightBytes
			if fullPages {
				n += int64(logicpage.RowsPerPage * w.t.rowBytes)
			}
			last = w.m
		}
		if w.off >= 0 && !fullPages {
			n += int64(w.t.rowBytes)
		}
	}
	return n
}

// waitSettled waits until every batch holding a version <= ver has settled (the cache's
// settledVer), so that a read sent after it finds their rows applied at the store (a fetch
// of a ghost row: see cache.go), or ctx ends (its error), or Close gave up on them (the
// pipeline's error, wrapping ErrUnknownOutcome). A batch not sent yet is kicked.
// Any goroutine but a connection's receiver may call it.
func (p *pipeline) waitSettled(ctx context.Context, ver uint64) error {
	c := p.db.cache
	if c.settledVer.Load() >= ver {
		return nil
	}
	if h := p.db.testHookWait; h != nil {
		h("settle")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	err := p.waitRoomLocked(ctx, func() bool {
		if c.settledVer.Load() >= ver || p.abandoned || p.db.unavailableErr() != nil {
			return true
		}
		p.kickNow()
		return false
	})
	if err == nil && c.settledVer.Load() < ver && !p.abandoned {
		err = p.db.unavailableErr() // the batches wait out the outage in flight
	}
	if err == nil && c.settledVer.Load() < ver {
		// Close gave up on the batches (abandonLocked): their outcome is unknown, and the
		// store may answer with the older row. Fail rather than hand it out.
		err = p.failErr
	}
	return err
}

// settleLocked advances the cache's settled version after batches through ver settled, and
// over the batches dropped unsent once nothing is in flight before them. Caller holds mu.
func (p *pipeline) settleLocked(ver uint64) {
	if len(p.inflight) == 0 {
		ver = max(ver, p.unsentVer)
	}
	p.db.cache.settle(ver)
}

// waitRoomLocked waits on room until ready reports true, or ctx ends (its error: the
// transaction is not installed, nothing is applied). Caller holds mu; ready is called under
// it.
func (p *pipeline) waitRoomLocked(ctx context.Context, ready func() bool) error {
	if ready() {
		return nil
	}
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.room.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	for !ready() {
		if err := ctx.Err(); err != nil {
			return err
		}
		p.room.Wait()
	}
	return nil
}

// addDone ends the install of a transaction that add admitted.
func (p *pipeline) addDone() {
	if p.db.opts.Durability == WriteBack {
		p.wbMu.RUnlock()
		if p.dirtyBytes.Load() > p.db.opts.CacheBytes/4 {
			p.flushSoon()
		}
		return
	}
	p.installDone()
}

// installDone ends an install counted in installing (Durable); a recovery waiting for the
// last one is woken.
func (p *pipeline) installDone() {
	if p.installing.Add(-1) == 0 && p.recovering.Load() {
		p.mu.Lock()
		p.room.Broadcast()
		p.mu.Unlock()
	}
}

// appendTx copies the transaction's writes (sorted by table and id) into b as one segment per
// page, and marks them in flight at ver in their frames. Caller holds mu.
func (p *pipeline) appendTx(b *batch, tx *Tx, ver uint64) {
	if p.db.opts.FullPageIO {
		p.appendTxFullPages(b, tx, ver)
		return
	}
	var lastFrame *frameMeta
	var lastMask uint64
	seg := -1
	for i := range tx.writes {
		w := &tx.writes[i]
		page, slot := logicpage.PageOf(w.id)
		bit := uint64(1) << slot
		if seg < 0 || b.segs[seg].Table != w.t.id || b.segs[seg].Page != page {
			b.segs = append(b.segs, base.Segment{Table: w.t.id, RowBytes: uint16(w.t.rowBytes), Page: page})
			b.segOff = append(b.segOff, len(b.buf))
			seg = len(b.segs) - 1
			if !hasTable(b.tables, w.t) {
				b.tables = append(b.tables, w.t)
			}
		}
		s := &b.segs[seg]
		if w.off >= 0 {
			s.Data |= bit
			b.buf = append(b.buf, tx.buf[w.off:int(w.off)+w.t.rowBytes]...)
		} else {
			s.Clear |= bit
		}
		if w.m != lastFrame {
			if lastFrame != nil {
				p.db.cache.markFlight(lastFrame, lastMask, ver)
			}
			b.frames = append(b.frames, refOf(w.m))
			lastFrame, lastMask = w.m, 0
		}
		lastMask |= bit
	}
	if lastFrame != nil {
		p.db.cache.markFlight(lastFrame, lastMask, ver)
	}
}

// appendTxFullPages is the Options.FullPageIO ablation: every page a transaction writes is
// shipped whole, its other present (cached) rows included, as a page-based store would.
//
// The other rows are copied under their version words, as a reader would: a row locked by
// another committer, or changed during the copy, is left out. Its locker ships it in its own
// segment, and that segment comes after this one, or it is an earlier transaction of this
// batch that has not installed yet, so the frame still holds the image before its write:
// shipping that image would undo the write at the store. An unlocked row's bytes are the
// newest installed image, which is at least as new as any segment already in a batch (a
// commit installs, and unlocks, only after its segment is in).
func (p *pipeline) appendTxFullPages(b *batch, tx *Tx, ver uint64) {
	for i := 0; i < len(tx.writes); {
		w0 := &tx.writes[i]
		page, _ := logicpage.PageOf(w0.id)
		j := i
		var data, clr uint64
		for ; j < len(tx.writes); j++ {
			w := &tx.writes[j]
			pg, slot := logicpage.PageOf(w.id)
			if w.t != w0.t || pg != page {
				break
			}
			if w.off >= 0 {
				data |= 1 << slot
			} else {
				clr |= 1 << slot
			}
		}
		m, r := w0.m, w0.t.rowBytes
		candidates := m.present.Load() & m.valid.Load() &^ (data | clr)
		segOff := len(b.buf)
		versions, rows := frameWords(m, r)
		var others uint64
		k := i
		for mask := data | candidates; mask != 0; mask &= mask - 1 {
			slot := bits.TrailingZeros64(mask)
			bit := uint64(1) << slot
			if data&bit != 0 {
				for tx.writes[k].id != logicpage.RowID(page, slot) {
					k++
				}
				w := &tx.writes[k]
				b.buf = append(b.buf, tx.buf[w.off:int(w.off)+r]...)
				continue
			}
			n := len(b.buf)
			b.buf = slices.Grow(b.buf, r)[:n+r]
			if copyUnlockedRow(m, versions, rows, slot, r, b.buf[n:]) {
				others |= bit
			} else {
				b.buf = b.buf[:n]
			}
		}
		b.segs = append(b.segs, base.Segment{Table: w0.t.id, RowBytes: uint16(r), Page: page, Data: data | others, Clear: clr})
		b.segOff = append(b.segOff, segOff)
		if !hasTable(b.tables, w0.t) {
			b.tables = append(b.tables, w0.t)
		}
		p.db.cache.markFlight(m, data|others|clr, ver)
		b.frames = append(b.frames, refOf(m))
		i = j
	}
}

// copyUnlockedRow copies the present row of slot into dst if it is valid and not locked, and
// stays so for the copy; it reports whether it did.
func copyUnlockedRow(m *frameMeta, versions []uint64, rows []byte, slot, r int, dst []byte) bool {
	bit := uint64(1) << slot
	v1 := atomic.LoadUint64(&versions[slot])
	if v1&versionLock != 0 || m.valid.Load()&m.present.Load()&bit == 0 {
		return false
	}
	logicpage.LoadRow(dst, rows[slot*r:(slot+1)*r])
	return atomic.LoadUint64(&versions[slot]) == v1
}

func hasTable(ts []*tableState, t *tableState) bool {
	for _, x := range ts {
		if x == t {
			return true
		}
	}
	return false
}

// sender sends the open batch whenever it has transactions and a slot is free.
func (p *pipeline) sender() {
	defer p.bg.Done()
	for {
		select {
		case <-p.kick:
		case <-p.stop:
			return
		}
		runtime.Gosched() // let concurrent commits join the batch
		p.mu.Lock()
		for p.open.nTx > 0 && len(p.inflight) < inflightMax && p.failErr == nil && !p.prepHold && p.rec == nil {
			b := p.open
			p.open = p.newBatchLocked()
			p.launchLocked(b)
		}
		p.mu.Unlock()
	}
}

// launchLocked numbers b and sends it. Caller holds mu; it is released during the send.
func (p *pipeline) launchLocked(b *batch) {
	b.seq = p.nextSeq
	p.nextSeq++
	// - Batches launch in increasing seq order (a prepare's seq may lie between two), so the
	//   store applies them in the order their versions were given; only a recovery, with
	//   nothing in flight, goes back to the refused seq (recover.go).
	// - At most inflightMax batches are in flight: every caller waits for a free slot.
	if b.seq <= p.launchedSeq {
		assert.Failf("txnode: commit batch seq %d launched after seq %d", b.seq, p.launchedSeq)
	}
	p.launchedSeq = b.seq
	p.inflight = append(p.inflight, b)
	assert.That(len(p.inflight) <= inflightMax, "txnode: commit batches in flight over their bound")
	b.commit = store.Batch{Owner: p.db.owner, Seq: b.seq, Segments: b.segs, Fences: b.commit.Fences[:0]}
	for i := range b.segs {
		end := len(b.buf)
		if i+1 < len(b.segs) {
			end = b.segOff[i+1]
		}
		b.segs[i].Rows = b.buf[b.segOff[i]:end:end]
	}
	for _, t := range b.tables {
		b.commit.Fences = append(b.commit.Fences, base.Fence{Table: t.id, Epoch: t.epoch.Load()})
	}
	p.room.Broadcast()
	p.mu.Unlock()
	b.gen = p.connGen()
	p.db.stats.batches.Add(1)
	p.db.stats.batchTx.Add(uint64(b.nTx))
	p.db.store.Commit(&b.commit, b.done)
	p.mu.Lock()
	b.returned = true
	p.recycleLocked(b)
}

// complete records a batch's outcome and retires completed batches in seq order.
func (p *pipeline) complete(b *batch, lsn uint64, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// - The store calls a batch's done once (store.Store.Commit).
	assert.That(!b.completed, "txnode: commit batch completed twice")
	b.lsn, b.err, b.completed = lsn, err, true
	if err != nil && p.failErr == nil && p.refusedLocked(b, err) {
		err = nil // recovering (recover.go): b fails with the range, the pipeline goes on
	}
	if err != nil {
		p.failLocked(b, err)
	}
	for len(p.inflight) > 0 && p.inflight[0].completed {
		x := p.inflight[0]
		n := copy(p.inflight, p.inflight[1:]) // shift, not reslice: append would reallocate
		p.inflight[n] = nil
		p.inflight = p.inflight[:n]
		// - Batches retire in increasing seq order, each with versions past the last
		//   retired batch's: the durable and settled versions they advance only grow.
		if x.seq <= p.retiredSeq || x.lastVer <= p.retiredVer {
			assert.Failf("txnode: commit batch seq %d (versions ..%d) retired after seq %d (..%d)",
				x.seq, x.lastVer, p.retiredSeq, p.retiredVer)
		}
		p.retiredSeq, p.retiredVer = x.seq, x.lastVer
		if x.held {
			p.answerHeldLocked(x)
		}
		if x.err == nil && x.firstVer >= p.failVer {
			// Acknowledged, but an earlier batch failed: the store applied it (it applies an
			// owner's batches in seq order), yet this node can no longer vouch for what came
			// before it. Report the first failure. (A batch before the failed one that is
			// acknowledged is durable: it succeeds.)
			x.err = p.failErr
		}
		if x.err == nil && p.rec != nil && x.seq > p.rec.seq {
			// Acknowledged after the store refused an earlier seq of this owner: the store
			// broke its order. Nothing can be vouched for: fail for good.
			p.failLocked(x, fmt.Errorf("%w: batch %d acknowledged after batch %d was refused", ErrUnknownOutcome, x.seq, p.rec.seq))
			x.err = p.failErr
		}
		if x.err == nil {
			// Before the batch settles: a fetch that waited for it fills at a version no
			// lower than the batch's.
			p.db.advanceDurable(x.lastVer)
		} else {
			p.db.cache.invalidateRefs(x.frames, true)
			if p.rec != nil {
				p.rec.frames = append(p.rec.frames, x.frames...)
				if x.gen != p.connGen() {
					p.rec.resent = true // it may have been sent again: see recover.go
				}
			}
		}
		p.flightBytes -= batchCost(x)
		x.retired = true
		p.settleLocked(x.lastVer)
		p.recycleLocked(x)
	}
	if len(p.inflight) == 0 {
		p.settleLocked(0) // the batches dropped unsent
	}
	// - flightBytes is the cost of the open batch and of the batches in flight (recounted
	//   in invariant builds only).
	assert.That(!assert.Invariants || p.flightBytes == p.flightBytesLocked(), "txnode: in-flight bytes do not add up")
	p.room.Broadcast()
	p.db.cache.signalRoom()
	if len(p.inflight) < inflightMax && p.open.nTx > 0 {
		p.kickNow()
	}
}

// failLocked fails the pipeline for good with b's error err: every later batch fails, the
// open one is dropped unsent, and every later commit returns the error wrapped. Caller
// holds mu.
func (p *pipeline) failLocked(b *batch, err error) {
	for _, t := range b.tables {
		t.noteFenced(err)
	}
	if p.failErr == nil {
		p.failErr = fmt.Errorf("txnode: commit batch %d: %w", b.seq, err)
		p.stopped.Store(true)
		p.db.opts.Logger.Error("txnode: commit batch failed; the node stops committing", "seq", b.seq, "err", err)
	}
	p.failVer = min(p.failVer, b.firstVer)
	p.db.failDurable(p.failVer) // waiters for this batch or later ones return the error
	if o := p.open; o.nTx > 0 {
		// The open batch is never sent now (add refuses commits from here on): its
		// commits fail with the others (failDurable), its frames are invalidated, as a
		// failed batch's are, and it settles once the batches before it have. (A commit
		// of it still installing may make its row valid again: its version is past
		// failVer, so a Durable reader waits for it and gets the failure.)
		p.db.cache.invalidateRefs(o.frames, false)
		p.unsentVer = max(p.unsentVer, o.lastVer)
		p.flightBytes -= batchCost(o)
		p.open = p.newBatchLocked()
		o.retired, o.returned = true, true
		p.recycleLocked(o)
	}
	if p.db.opts.Durability == WriteBack {
		p.flushSoon() // the next cut invalidates the rows installed since (flushEpoch)
	}
}

// abandonLocked fails the pipeline when close's context ends with batches not acknowledged:
// their outcome is unknown (the store may still apply them). Caller holds mu.
func (p *pipeline) abandonLocked(cause error) {
	if p.failErr == nil {
		p.failErr = fmt.Errorf("%w: closed with commit batches not acknowledged: %w", ErrUnknownOutcome, cause)
		p.stopped.Store(true)
	}
	from := uint64(math.MaxUint64)
	if len(p.inflight) > 0 {
		from = p.inflight[0].firstVer
	} else if p.open.nTx > 0 {
		from = p.open.firstVer
	}
	p.failVer = min(p.failVer, from)
	p.db.failDurable(p.failVer)
	// A held batch is never back now: its outcome is unknown, whatever failed the pipeline
	// before (a later batch's error may say "nothing applied" of that batch only).
	held := p.failErr
	if !errors.Is(held, ErrUnknownOutcome) {
		held = fmt.Errorf("%w: closed with commit batches not acknowledged: %w", ErrUnknownOutcome, cause)
	}
	for _, x := range p.inflight {
		if x.held {
			x.held = false
			p.db.releaseHeld(x.firstVer, x.lastVer, false, held, 0)
		}
	}
	p.abandoned = true
	p.room.Broadcast()
}

// noteDirty records a frame that became dirty (WriteBack).
func (p *pipeline) noteDirty(m *frameMeta) {
	p.dirtyMu.Lock()
	p.dirty = append(p.dirty, m)
	p.dirtyMu.Unlock()
	p.dirtyBytes.Add(frameCost(int(m.rowBytes)))
}

func (p *pipeline) flusher() {
	defer p.bg.Done()
	tick := time.NewTicker(p.db.opts.FlushInterval)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
		case <-p.flushReq:
		case r := <-p.cutReq:
			r <- p.flushEpoch() // buffered: flush may have given up waiting
			continue
		}
		p.flushEpoch()
	}
}

// flushEpoch takes a consistent cut of every dirty row into one batch and sends it. Epochs
// are cut, numbered and sent one at a time (flushMu): were two cuts in progress at once, the
// older could get the higher seq, so older row images would overwrite newer ones at the
// store, and an empty cut could advance the durable version past an epoch not yet sent.
func (p *pipeline) flushEpoch() (cut uint64) {
	p.flushMu.Lock()
	defer p.flushMu.Unlock()
	p.mu.Lock()
	b := p.newBatchLocked()
	p.mu.Unlock()
	p.wbMu.Lock()
	cut = p.db.commitVer.Load()
	// The batch holds the commits after the last cut: a failure fails those and later ones.
	firstVer := p.cutVer + 1
	p.cutVer = cut
	p.dirtyMu.Lock()
	frames := p.dirty
	p.dirty, p.dirtySpare = p.dirtySpare, nil
	p.dirtyBytes.Store(0)
	p.dirtyMu.Unlock()
	for _, m := range frames {
		// Installs are excluded, so only this cut clears dirty bits (and dropTable). A frame
		// with dirty rows is not evicted; pin it before clearing them and until its rows are
		// copied and marked in flight, so the evictor never takes it in between (its memory
		// is read here; after the copy the batch needs it no more: see cache.go).
		if m.dirty.Load() == 0 {
			continue // listed twice, or its table dropped
		}
		m.pins.Add(1)
		d := m.dirty.Swap(0)
		key := m.key.Load()
		var t *tableState
		if key != 0 && d != 0 {
			p.db.mu.Lock()
			t = p.db.byID[uint32(key>>32)]
			p.db.mu.Unlock()
		}
		if t == nil {
			p.db.cache.unpin(m)
			continue
		}
		present := m.present.Load()
		s := base.Segment{Table: t.id, RowBytes: uint16(t.rowBytes), Page: key & (1<<32 - 1), Data: d & present, Clear: d &^ present}
		b.segOff = append(b.segOff, len(b.buf))
		_, rows := frameWords(m, t.rowBytes)
		b.buf = appendRows(b.buf, rows, t.rowBytes, s.Data)
		b.segs = append(b.segs, s)
		if !hasTable(b.tables, t) {
			b.tables = append(b.tables, t)
		}
		b.frames = append(b.frames, refOf(m))
		p.db.cache.markFlight(m, d, cut)
		p.db.cache.unpin(m)
	}
	clear(frames)
	p.dirtySpare = frames[:0]
	p.dirtyRows.Store(0)
	p.dirtyRowBytes.Store(0)
	p.wbMu.Unlock()
	p.mu.Lock()
	p.room.Broadcast() // commits waiting for the epoch bound
	p.mu.Unlock()

	p.mu.Lock()
	defer p.mu.Unlock()
	if len(b.segs) == 0 {
		if len(p.inflight) == 0 && p.failErr == nil {
			p.db.advanceDurable(cut)
		}
		b.retired, b.returned = true, true
		p.recycleLocked(b)
		return cut
	}
	cost := batchCost(b)
	for (len(p.inflight) >= inflightMax || p.prepHold || p.flightBytes > 0 && p.flightBytes+cost > p.flightMax) && p.failErr == nil {
		p.room.Wait()
	}
	if p.failErr != nil {
		// Rows that will never be durable: invalidate them (read from the store again), as a
		// failed batch's are, or reads would go on returning them. The epoch settles once
		// the batches before it have.
		p.db.cache.invalidateRefs(b.frames, false)
		p.unsentVer = max(p.unsentVer, cut)
		p.settleLocked(0)
		p.room.Broadcast()
		b.retired, b.returned = true, true
		p.recycleLocked(b)
		return cut
	}
	b.firstVer, b.lastVer, b.nTx = firstVer, cut, 1
	p.flightBytes += cost
	p.launchLocked(b)
	return cut
}

// flush makes every commit so far durable: WriteBack flushes an epoch; both wait for the
// batches in flight. WriteBack waits for its own cut, not for the commit counter read after
// it: commits made since are in no epoch yet (with a long FlushInterval it waited for the
// next one).
func (p *pipeline) flush(ctx context.Context) error {
	if err := p.failure(); err != nil {
		return err
	}
	// Commits of a failed range will never be durable (recover.go): wait for those before.
	ver := p.db.failedFloor(p.db.commitVer.Load())
	if p.db.opts.Durability == WriteBack {
		// The flusher cuts: an epoch, once cut, waits for room in flight (flushEpoch) and
		// cannot be given up, so this waits for its cut only as long as ctx allows.
		r := make(chan uint64, 1)
		select {
		case p.cutReq <- r:
		case <-ctx.Done():
			return ctx.Err()
		case <-p.stop:
			return ErrClosed
		}
		select {
		case ver = <-r:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	p.kickNow()
	return p.db.waitDurable(ctx, ver)
}

// close stops admitting commits, flushes, waits for every batch, and stops the goroutines.
// Commits are refused first: one admitted after the last flush would be acknowledged
// (WriteBack) and never written. It waits for the batches only as long as ctx allows: then
// the pipeline fails with ErrUnknownOutcome (wrapping ctx's error), so the commits still
// waiting for those batches return it, nothing more is sent, and close returns ctx's error.
func (p *pipeline) close(ctx context.Context) error {
	p.mu.Lock()
	p.closing = true
	p.stopped.Store(true)
	p.mu.Unlock()
	err := p.flush(ctx)
	stopWake := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.room.Broadcast()
		p.mu.Unlock()
	})
	defer stopWake()
	p.mu.Lock()
	for len(p.inflight) > 0 || (p.open.nTx > 0 && p.failErr == nil) {
		cerr := ctx.Err()
		if cerr == nil {
			// An outage is not waited out either: the batches in flight may apply when the
			// storage node is back, after this Close.
			cerr = p.db.unavailableErr()
		}
		if cerr != nil {
			p.abandonLocked(cerr)
			if err == nil {
				err = cerr
			}
			break
		}
		p.kickNow()
		p.room.Wait()
	}
	p.room.Broadcast()
	p.mu.Unlock()
	close(p.stop)
	p.bg.Wait()
	if errors.Is(err, ErrClosed) {
		err = nil
	}
	return err
}
