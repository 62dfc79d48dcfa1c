package node

import (
	"context"
	"iter"

	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/txncoord"
)

// A cluster table is a txnode.RowTable: txnode.TypedOf gives it the typed API of a plain
// table's single-row calls and scans.
var _ txnode.RowTable = (*Table)(nil)

// Scan returns the rows of ids in [lo, hi) in id order, over every partition: each
// partition's rows come from its table (txnode.Table.Scan) where this node owns it, from its
// storage node's durable rows (txncoord.DurableTable.Scan) where it does not, and the
// partitions' sequences are merged by id. A read pass, not a snapshot (Tx.Scan is a
// transaction's). Row.Data stays valid until the loop asks for the next row. An error ends
// the sequence as its last element.
//   - Each partition's table holds only its own stripes, so each sequence is in id order and
//     the merge needs only the head of each.
func (t *Table) Scan(ctx context.Context, lo, hi uint64) iter.Seq2[txnode.Row, error] {
	return func(yield func(txnode.Row, error) bool) {
		if err := t.n.closedErr(); err != nil {
			yield(txnode.Row{}, err)
			return
		}
		if err := t.follow(ctx); err != nil {
			yield(txnode.Row{}, t.n.after(err))
			return
		}
		type head struct {
			next func() (txnode.Row, error, bool)
			stop func()
			addr string
			row  txnode.Row
			ok   bool
		}
		heads := make([]head, len(t.parts))
		defer func() {
			for _, h := range heads {
				if h.stop != nil {
					h.stop()
				}
			}
		}()
		// advance moves h to its partition's next row; false when the scan is over (an error
		// was yielded as its last element).
		advance := func(h *head) bool {
			row, err, ok := h.next()
			if err != nil {
				yield(txnode.Row{}, t.n.after(t.n.noteErr(h.addr, err)))
				return false
			}
			h.row, h.ok = row, ok
			return true
		}
		for p := range t.parts {
			pt := &t.parts[p]
			if err := t.heal(ctx, uint32(p)); err != nil {
				yield(txnode.Row{}, t.n.after(err))
				return
			}
			h := &heads[p]
			tb := pt.tb.Load()
			if tb != nil {
				if serr := txncoord.Serving(tb); t.gone(uint32(p), serr) {
					// Its grant ended (another handle released it, a fence): not owned
					// any more, read from its storage node, as Get does.
					if !t.moving(ctx, uint32(p), serr) {
						t.drop(uint32(p))
					}
					tb = nil
				}
			}
			if tb != nil {
				h.next, h.stop = iter.Pull2(tb.Scan(ctx, lo, hi))
				h.addr = pt.addr()
			} else {
				r := pt.r.Load()
				h.next, h.stop = iter.Pull2(r.durable.Scan(ctx, lo, hi))
				h.addr = r.addr
			}
			if !advance(h) {
				return
			}
		}
		for {
			var min *head
			for i := range heads {
				if h := &heads[i]; h.ok && (min == nil || h.row.ID < min.row.ID) {
					min = h
				}
			}
			if min == nil {
				return
			}
			if !yield(min.row, nil) || !advance(min) {
				return
			}
		}
	}
}

// ScanAll returns every row of the table in id order, as Scan(ctx, 0, ∞).
func (t *Table) ScanAll(ctx context.Context) iter.Seq2[txnode.Row, error] {
	return t.Scan(ctx, 0, ^uint64(0))
}
