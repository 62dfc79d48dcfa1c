package storenode

import (
	"fmt"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/assert"
)

// Per-owner bounds on prepared parts, and the checkpoint's carry of them in chunks (issue
// 22, defect 6).
//
// Invariants, under mu:
//   - txnOwners[o] counts owner o's prepared (not applied) parts and the bytes of their
//     prepare records; an owner with none has no entry. A prepare past
//     Options.MaxTxnsPerOwner or MaxTxnBytesPerOwner is refused with ErrTxnBusy for that
//     owner only (what replay rebuilds may pass them: nothing replayed is refused).
//   - while a checkpoint carries the parts (txnCarry.from != 0, the checkpoint LSN), a part
//     whose newest full record (prepare, apply or carry) is at or before that LSN is carried
//     before any later record of it is appended: applyTxnLocked carries it first
//     (carryPartFirst). So replay from the checkpoint meets every part's prepare before its
//     apply, although the carry runs in chunks of txnCarryBytes with mu released between.

// txnOwnerUse is one owner's prepared parts.
type txnOwnerUse struct {
	parts int
	bytes int64
}

// checkOwnerQuota refuses a prepare of size bytes past owner's bounds. Caller holds mu.
func (e *Engine) checkOwnerQuota(owner uint64, size int) error {
	u := e.txnOwners[owner]
	if u.parts >= e.opts.MaxTxnsPerOwner {
		return fmt.Errorf("%w: owner %d holds %d transactions prepared (MaxTxnsPerOwner)", ErrTxnBusy, owner, u.parts)
	}
	if u.bytes+int64(size) > e.opts.MaxTxnBytesPerOwner {
		return fmt.Errorf("%w: owner %d holds %d bytes of prepared batches, %d more would pass MaxTxnBytesPerOwner %d",
			ErrTxnBusy, owner, u.bytes, size, e.opts.MaxTxnBytesPerOwner)
	}
	return nil
}

// ownerQuotaAdd adds parts prepared parts of owner and their bytes (both negative when
// they are applied). Caller holds mu.
func (e *Engine) ownerQuotaAdd(owner uint64, parts, bytes int) {
	u := e.txnOwners[owner]
	u.parts += parts
	u.bytes += int64(bytes)
	assert.That(u.parts >= 0 && u.bytes >= 0, "storenode: owner quota below zero")
	if u.parts == 0 {
		delete(e.txnOwners, owner)
		return
	}
	e.txnOwners[owner] = u
}

// txnCarryBytes bounds the prepare records one lock hold of a checkpoint's carry re-logs
// (at least one record): a flood of large prepares cannot stall other owners' commits for
// the whole re-log.
const txnCarryBytes = 1 << 20

// txnCarry is a checkpoint's carry of the prepared parts, after the snapshot's hold.
type txnCarry struct {
	ids     []base.TxnID            // listed in the snapshot's hold, in no order
	pending map[base.TxnID]struct{} // not carried yet; nil while no carry runs
	// chunkBytes overrides txnCarryBytes (tests); between, when set (tests), runs between
	// two chunks, mu released.
	chunkBytes int
	between    func()
}

// carryBegin starts a carry. Caller holds mu, in the snapshot's hold.
func (e *Engine) carryBegin() {
	c := &e.txnCarry
	c.ids = c.ids[:0]
	clear(c.pending)
}

// carryLater lists a prepared part to carry after the snapshot's hold. Caller holds mu.
func (e *Engine) carryLater(id base.TxnID) {
	c := &e.txnCarry
	if c.pending == nil {
		c.pending = make(map[base.TxnID]struct{})
	}
	c.ids = append(c.ids, id)
	c.pending[id] = struct{}{}
}

// carryPartFirst carries p, if a running carry has not yet, before a later record of it.
// Caller holds mu.
func (e *Engine) carryPartFirst(p *txnPart) error {
	c := &e.txnCarry
	if _, ok := c.pending[p.id]; !ok {
		return nil
	}
	delete(c.pending, p.id)
	_, err := e.appendRecord(kindTxnPrepare, p.rec, false, noAck)
	return err
}

// carryPrepared re-logs the prepared parts carryTxns listed and not carried since, at most
// txnCarryBytes of records per hold of mu, and returns the last LSN appended then (0 when
// none). Called by the checkpoint (under ckptMu) without mu.
func (e *Engine) carryPrepared() (uint64, error) {
	c := &e.txnCarry
	if len(c.ids) == 0 {
		return 0, nil
	}
	limit := c.chunkBytes
	if limit <= 0 {
		limit = txnCarryBytes
	}
	var last uint64
	for i := 0; i < len(c.ids); {
		if i > 0 && c.between != nil {
			c.between()
		}
		e.mu.Lock()
		for used := 0; i < len(c.ids) && used < limit; i++ {
			id := c.ids[i]
			if _, ok := c.pending[id]; !ok {
				continue
			}
			delete(c.pending, id)
			p := e.txnParts[id]
			if p == nil || p.decision != base.DecisionNone {
				continue // applied: carryPartFirst carried it before its apply record
			}
			lsn, err := e.appendRecord(kindTxnPrepare, p.rec, false, noAck)
			if err != nil {
				clear(c.pending)
				e.mu.Unlock()
				return 0, err
			}
			last = max(last, lsn, e.lastLSN)
			used += len(p.rec)
		}
		if i == len(c.ids) {
			last = max(last, e.lastLSN) // and what carryPartFirst appended meanwhile
			clear(c.pending)
			c.ids = c.ids[:0]
		}
		e.mu.Unlock()
	}
	return last, nil
}
