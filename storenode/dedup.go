package storenode

import (
	"fmt"
	"time"

	"github.com/weftdb/weft/base"
)

// The owners table: per owner id, the last applied batch seq and a window of the most recent
// applied batches (seq, LSN, batch hash), saved in every checkpoint's meta file and rebuilt
// by replay. It is what makes a retried batch safe:
//
//   - a batch whose seq is in the window is acknowledged again, with its own LSN once that is
//     durable, only if its hash is the applied batch's (even if its fences moved since: its
//     acknowledgement may have been lost); a different batch under an applied seq is
//     rejected with ErrSeqReused, never acknowledged;
//   - an applied seq older than the window gets ErrUnknownOutcome: it was applied once, but
//     whether it is this batch cannot be told any more;
//   - a batch not yet applied is fence-checked before it waits for a seq gap.
//
// Invariants: an entry exists only for an owner with at least one applied batch (a rejected
// batch creates none); the window holds the seqs lastSeq-n+1 .. lastSeq, consecutive, since an
// owner's batches are applied in seq order; n <= dedupWindow.
//
// Expiry: an owner that holds no table, has no connection and has not had a batch applied
// for Options.OwnerExpiry (engine clock; the count restarts at Open) is dropped, window and
// all, by the next checkpoint. Its later batches are fenced (it holds nothing), so nothing it
// retries can be applied twice.

// dedupWindow is how many recent applied batches each owner's window remembers. A transaction
// node keeps at most 8 batches in flight, so every retry of an in-flight batch is in it.
//
// Part of the format (meta); do not change.
const dedupWindow = 64

// dedupEntry is one applied batch in an owner's window.
type dedupEntry struct {
	seq  uint64
	lsn  uint64
	hash uint64
}

// ownerState is one owner's entry of the owners table. Guarded by Engine.mu.
type ownerState struct {
	lastSeq uint64
	lastLSN uint64
	// window is a ring of the last n applied batches, the batch of seq s at s % len(window):
	// dedupWindow entries once a batch was applied in this run, exactly n when decoded from a
	// meta file (so a meta file's owners cost memory in proportion to its bytes; applied
	// grows it); nil when n is 0.
	window []dedupEntry
	n      int
	// active is when the owner's last batch was applied (or the engine opened): the start of
	// its idle time for expiry. Memory only.
	active time.Time
	// refused, when above lastSeq, is the lowest seq of a batch refused since (noteRefused):
	// a later batch cannot be applied before the owner sends that seq again, so it is refused
	// at once (refusedGap). Memory only.
	refused uint64
}

// refusedGap reports why the owner's batch of seq, beyond lastSeq+1, cannot wait for its
// gap: a batch of a seq in the gap was refused (ErrSeqGap, naming it); nil otherwise.
func (o *ownerState) refusedGap(seq uint64) error {
	if o.refused > o.lastSeq && o.refused < seq {
		return fmt.Errorf("%w: batch seq %d, last applied %d: the batch of seq %d was refused", ErrSeqGap, seq, o.lastSeq, o.refused)
	}
	return nil
}

// remember records the applied batch (seq, lsn, hash) in the window and as the last: seq must
// be lastSeq+1, or any seq for an owner with no window yet (replay after a checkpoint that
// expired nothing).
func (o *ownerState) remember(seq, lsn, hash uint64) {
	if len(o.window) < dedupWindow {
		ring := make([]dedupEntry, dedupWindow)
		for _, d := range o.entries() {
			ring[d.seq%dedupWindow] = d
		}
		o.window = ring
	}
	if seq != o.lastSeq+1 {
		o.n = 0 // not consecutive: the window restarts (only replay of an upgraded store)
	}
	o.window[seq%dedupWindow] = dedupEntry{seq: seq, lsn: lsn, hash: hash}
	o.n = min(o.n+1, dedupWindow)
	o.lastSeq, o.lastLSN = seq, lsn
}

// lookup finds the applied batch of seq <= lastSeq in the window.
func (o *ownerState) lookup(seq uint64) (dedupEntry, bool) {
	if o.n == 0 || seq > o.lastSeq || o.lastSeq-seq >= uint64(o.n) {
		return dedupEntry{}, false
	}
	ent := o.window[seq%uint64(len(o.window))]
	return ent, ent.seq == seq
}

// entries returns the window's entries, oldest first.
func (o *ownerState) entries() []dedupEntry {
	out := make([]dedupEntry, 0, o.n)
	for s := o.lastSeq - uint64(o.n) + 1; o.n > 0 && s <= o.lastSeq; s++ {
		out = append(out, o.window[s%uint64(len(o.window))])
	}
	return out
}

// clone copies o for a meta snapshot.
func (o *ownerState) clone() ownerState {
	c := *o
	if o.window != nil {
		c.window = append([]dedupEntry(nil), o.window...)
	}
	return c
}

// retried answers a batch whose seq the owner already applied (b.Seq <= o.lastSeq). Caller
// holds mu. It returns the LSN to acknowledge the batch with once durable, or the error that
// rejects it.
func (o *ownerState) retried(b *base.Batch, hash uint64) (uint64, error) {
	ent, ok := o.lookup(b.Seq)
	if !ok {
		return 0, fmt.Errorf("%w: batch seq %d was applied before the %d batches the storage node remembers (last applied %d)",
			ErrUnknownOutcome, b.Seq, dedupWindow, o.lastSeq)
	}
	if ent.hash != hash {
		return 0, fmt.Errorf("%w: batch seq %d differs from the batch applied under that seq", ErrSeqReused, b.Seq)
	}
	return ent.lsn, nil
}

// expireOwners drops owners that hold no table, have no live identity and have been idle for
// Options.OwnerExpiry. A replica decides nothing on its own clock (replicas would answer a
// late retry differently, docs/replication.md 1.2): its leader proposes the expiry
// (proposeExpiry, kindExpired) and every replica drops the owners at its apply. Caller holds
// mu.
func (e *Engine) expireOwners() {
	if e.opts.OwnerExpiry < 0 || len(e.owners) == 0 {
		return
	}
	if e.replicated() {
		e.proposeExpiry()
		return
	}
	e.idleOwners(func(id uint64, _ *ownerState) bool {
		e.dropOwner(id)
		return true
	})
}

// idleOwners calls fn for each owner that holds no table, has no live identity and has been
// idle for Options.OwnerExpiry, until fn returns false. fn may drop the owner. Caller holds
// mu.
func (e *Engine) idleOwners(fn func(id uint64, o *ownerState) bool) {
	now := e.opts.Now()
	holders := make(map[uint64]bool, len(e.tables))
	for _, t := range e.tables {
		if t.holder != 0 {
			holders[t.holder] = true
		}
	}
	for id, o := range e.owners {
		if holders[id] || now.Sub(o.active) < e.opts.OwnerExpiry || e.hasIdent(id, now) {
			continue
		}
		if !fn(id, o) {
			return
		}
	}
}

// dropOwner forgets owner id: its dedup window, refused-gap memory and lease seq. Caller
// holds mu.
func (e *Engine) dropOwner(id uint64) {
	delete(e.owners, id)
	delete(e.refusedFresh, id)
	e.leaseMu.Lock()
	delete(e.leaseSeqs, id)
	e.leaseMu.Unlock()
	e.stats.ownersExpired.Add(1)
}

// applyExpired drops the owners expiry record p names whose last applied seq is still the
// record's and that hold no table (a batch or a grant applied since the leader decided keeps
// the owner, on every replica alike). Owners gone already are skipped (a record a checkpoint
// covers, replayed). Caller holds mu.
func (e *Engine) applyExpired(p []byte) error {
	var holders map[uint64]bool
	return decodeExpiredRecord(p, func(x expiredOwner) {
		o := e.owners[x.owner]
		if o == nil || o.lastSeq != x.seq {
			return
		}
		if holders == nil {
			holders = make(map[uint64]bool, len(e.tables))
			for _, t := range e.tables {
				if t.holder != 0 {
					holders[t.holder] = true
				}
			}
		}
		if !holders[x.owner] {
			e.dropOwner(x.owner)
		}
	})
}

// applied records an owner's applied batch in its owners-table entry (creating it) and in
// leaseSeqs. Caller holds mu.
func (e *Engine) applied(owner, seq, lsn, hash uint64) {
	o := e.owner(owner)
	if r, ok := e.refusedFresh[owner]; ok { // its first batch: the refusal moves to its entry
		delete(e.refusedFresh, owner)
		if r > seq && o.refused <= o.lastSeq {
			o.refused = r
		}
	}
	o.remember(seq, lsn, hash)
	e.leaseMu.Lock()
	e.leaseSeqs[owner] = seq
	e.leaseMu.Unlock()
}
