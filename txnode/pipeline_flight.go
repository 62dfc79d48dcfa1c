package txnode

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/assert"
)

// The commit pipeline's batches in flight: launched in seq order by the sender, completed by
// the store, retired and settled in seq order; the pipeline's fail-stop.

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
	b.commit = base.Batch{Owner: p.db.owner, Seq: b.seq, Segments: b.segs, Fences: b.commit.Fences[:0]}
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
