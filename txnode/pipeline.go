package txnode

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/weftdb/weft/base"
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
	commit   base.Batch
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
	p.closeWrites(&t.dropping, closed)
}

// closeWrites sets flag (a table's dropping or held) as closeTable does: once it returns
// with closed, add refuses a transaction that writes the table, and every commit admitted
// before has its version (WriteBack: its install is done), so a flush after it covers them.
func (p *pipeline) closeWrites(flag *atomic.Bool, closed bool) {
	p.mu.Lock()
	flag.Store(closed)
	p.mu.Unlock()
	if closed && p.db.opts.Durability == WriteBack {
		// An install that checked the flag before it was set holds wbMu (read) until it has
		// its version and is installed: taking it for writing waits for them (a barrier).
		p.wbMu.Lock()
		p.wbMu.Unlock()
	}
}

// droppingErr is ErrTableNotFound for a transaction that writes a table being dropped, and
// ErrMoved for one that writes a table whose writes are held (txncoord.HoldWrites).
func droppingErr(tx *Tx) error {
	var last *tableState
	for i := range tx.writes {
		if t := tx.writes[i].t; t != last {
			if t.forgotten.Load() {
				return t.forgottenErr()
			}
			if t.dropping.Load() {
				return fmt.Errorf("%w: %q is being dropped", ErrTableNotFound, t.name)
			}
			if t.held.Load() {
				return fmt.Errorf("%w: %q: its writes are held while its partition moves; retry once the move ends", ErrMoved, t.name)
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
