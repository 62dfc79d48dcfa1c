package hashindex

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"

	"github.com/weftdb/weft/internal/corrupt"
)

// The directory snapshot: bucket numbers to their primary row ids, refreshed from the
// committed rows, and a hash's home bucket found through it.

// memoOf is what dirSlot.checked holds once its row passed every check (its checksum
// included) at version ver (txnode's row version, which is below 2^63): never 0, which
// means never verified.
func memoOf(ver uint64) uint64 { return ^ver }

// dirCache is a snapshot of the committed directory: buckets [0, n) and their primary row
// ids, which never change once committed (buckets are never removed or moved), so a snapshot
// is never wrong, only short (or, after a lost WriteBack epoch, ahead: see refresh). Refreshes
// append to the slices beyond every published length.
type dirCache struct {
	n       uint64
	slots   []dirSlot // bucket b's, len n
	dirRows []uint64  // row id of directory row d
}

// dirSlot is a bucket's entry in the directory snapshot: its primary row id and, in the
// same cache line (a lookup needs both), checked: memoOf the row's txnode version when
// Lookup's fast path last verified it (0: never), accessed atomically. The fast path skips
// the checksum of a row whose version is the one verified: a row's version identifies its
// bytes for the DB's life (txnode's Table.ViewVersion), so a row rewritten since (by this
// package or through the raw Table API), refetched or replaced has another version and is
// checked again. The array grows by doubling (appendSlot), so the
// snapshots of a length share it; a memo stored into an array replaced since is lost, which
// costs one more checksum.
type dirSlot struct {
	id      uint64 // written before the snapshot that counts it is published, never after
	checked uint64
}

// appendSlot appends bucket row id to s, beyond every published length: into s's array
// while it has room, else into a copy of twice the size (the memo words copied atomically:
// lookups store them concurrently).
func appendSlot(s []dirSlot, id uint64) []dirSlot {
	if len(s) == cap(s) {
		g := make([]dirSlot, len(s), max(16, 2*cap(s)))
		for i := range s {
			g[i] = dirSlot{id: s[i].id, checked: atomic.LoadUint64(&s[i].checked)}
		}
		s = g
	}
	return append(s, dirSlot{id: id})
}

// refresh extends the directory snapshot to the committed header's bucket count, reading
// (committed) rows one at a time: entries already cached never change, so only the last
// cached directory row and the ones after it are read.
//
// With reset it reads the whole directory afresh and replaces the snapshot, even by a
// shorter one: a snapshot can be ahead of the committed rows when a split committed in
// WriteBack mode is lost with its epoch (txnode drops the cached state of a batch the
// storage node refused), and its bucket then no longer exists.
func (ix *Index) refresh(ctx context.Context, reset bool) error {
	select {
	case ix.dirMu <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-ix.dirMu }()
	c := ix.dir.Load()
	if reset {
		c = &dirCache{}
	}
	bp := ix.buf()
	defer ix.bufs.Put(bp)
	row := *bp
	s := src{ctx: ctx}
	h, err := ix.readHeader(s, row)
	if err != nil {
		return err
	}
	if h.buckets <= c.n {
		return nil
	}
	buckets, dirRows := c.slots, c.dirRows
	d := uint64(len(buckets) / ix.dirCap) // the directory row holding bucket len(buckets)
	var id uint64
	switch {
	case d < uint64(len(dirRows)):
		id = dirRows[d]
	case len(dirRows) == 0:
		id = h.dirHead
	default:
		if err := ix.get(s, dirRows[len(dirRows)-1], row); err != nil {
			return err
		}
		v, err := ix.fmt.decodeRow(row)
		if err != nil {
			return err
		}
		id = v.next
	}
	for uint64(len(buckets)) < h.buckets {
		if id == noRow || d >= h.dirRows {
			return corrupt.Errorf("hashindex: table %q: directory ends at row %d, before bucket %d of %d", ix.t.Name(), d, len(buckets), h.buckets)
		}
		if err := ix.get(s, id, row); err != nil {
			return err
		}
		v, err := ix.fmt.decodeRow(row)
		if err != nil {
			return err
		}
		if v.kind != kindDirectory || v.number != d {
			return corrupt.Errorf("hashindex: table %q: row %d is not directory row %d", ix.t.Name(), id, d)
		}
		if d == uint64(len(dirRows)) {
			dirRows = append(dirRows, id)
		}
		for i := len(buckets) - int(d)*ix.dirCap; i < v.count && uint64(len(buckets)) < h.buckets; i++ {
			buckets = appendSlot(buckets, binary.LittleEndian.Uint64(v.body[8*i:]))
		}
		if uint64(len(buckets)) < h.buckets && v.count < ix.dirCap {
			return corrupt.Errorf("hashindex: table %q: directory row %d holds %d entries, the header counts %d buckets", ix.t.Name(), d, v.count, h.buckets)
		}
		id, d = v.next, d+1
	}
	ix.dir.Store(&dirCache{n: h.buckets, slots: buckets, dirRows: dirRows})
	return nil
}

// bucketID returns the primary row id of bucket b: from the committed directory (refreshed
// when b is beyond it), or, inside a transaction that split buckets itself, from its own
// uncommitted directory rows (never cached: the transaction may still abort).
func (ix *Index) bucketID(s src, b uint64) (uint64, error) {
	if c := ix.dir.Load(); b < c.n {
		return c.slots[b].id, nil
	}
	// The refresh reads committed rows outside any transaction, under the transaction's
	// context inside one; the rows it reads are the header and the directory tail, which
	// every split reads too, so they are almost always cached.
	ctx := s.ctx
	if s.tx != nil {
		ctx = s.tx.Context()
	}
	if err := ix.refresh(ctx, false); err != nil {
		return 0, err
	}
	c := ix.dir.Load()
	if b < c.n {
		return c.slots[b].id, nil
	}
	if s.tx == nil {
		return 0, corrupt.Errorf("hashindex: table %q: bucket %d is addressed, the directory holds %d", ix.t.Name(), b, c.n)
	}
	bp := ix.buf()
	defer ix.bufs.Put(bp)
	row := *bp
	h, err := ix.readHeader(s, row)
	if err != nil {
		return 0, err
	}
	if b >= h.buckets {
		return 0, corrupt.Errorf("hashindex: table %q: bucket %d is addressed, the header counts %d", ix.t.Name(), b, h.buckets)
	}
	// Walk this transaction's view of the directory from the last committed row (splits
	// only append, so the rows before it are the committed ones).
	d := b / uint64(ix.dirCap)
	id, dd := h.dirHead, uint64(0)
	if len(c.dirRows) > 0 {
		id, dd = c.dirRows[len(c.dirRows)-1], uint64(len(c.dirRows)-1)
	}
	for ; dd < d; dd++ {
		if err := ix.get(s, id, row); err != nil {
			return 0, err
		}
		v, err := ix.fmt.decodeRow(row)
		if err != nil {
			return 0, err
		}
		if v.next == noRow {
			return 0, corrupt.Errorf("hashindex: table %q: directory ends at row %d, before bucket %d", ix.t.Name(), dd, b)
		}
		id = v.next
	}
	if err := ix.get(s, id, row); err != nil {
		return 0, err
	}
	v, err := ix.fmt.decodeRow(row)
	if err != nil {
		return 0, err
	}
	i := int(b % uint64(ix.dirCap))
	if v.kind != kindDirectory || v.number != d || i >= v.count {
		return 0, corrupt.Errorf("hashindex: table %q: row %d does not hold bucket %d of directory row %d", ix.t.Name(), id, b, d)
	}
	return binary.LittleEndian.Uint64(v.body[8*i:]), nil
}

// home reads the primary row of the bucket that holds hash h into row and returns its id and
// decoded view. The directory snapshot may be short (buckets split since): a bucket row
// knows its own level, so a row whose level says h moved on leads to the bucket it moved to,
// the one its split at the lowest level where h differs created.
func (ix *Index) home(s src, h uint64, row []byte) (uint64, rowView, error) {
	b, level := address(h, ix.dir.Load().n)
	reset := false
	for range levelMax + 1 {
		id, v, err := ix.primary(s, b, level, row)
		if err != nil {
			if reset || !errors.Is(err, corrupt.ErrCorruption) {
				return 0, rowView{}, err
			}
			// Perhaps a snapshot ahead of the committed rows (see refresh): read the
			// directory afresh and start again once; corruption if it persists.
			ctx := s.ctx
			if s.tx != nil {
				ctx = s.tx.Context()
			}
			reset = true
			if rerr := ix.refresh(ctx, true); rerr != nil {
				return 0, rowView{}, errors.Join(err, rerr)
			}
			b, level = address(h, ix.dir.Load().n)
			if id, v, err = ix.primary(s, b, level, row); err != nil {
				return 0, rowView{}, err
			}
		}
		if mask(h, v.level) == b {
			return id, v, nil
		}
		j := uint8(bits.TrailingZeros64(mask(h, v.level) ^ b))
		b, level = b|1<<j, j+1
	}
	return 0, rowView{}, corrupt.Errorf("hashindex: table %q: bucket levels do not end", ix.t.Name())
}

// primary reads the primary row of bucket b into row and checks that it is that bucket, at
// level or more.
func (ix *Index) primary(s src, b uint64, level uint8, row []byte) (uint64, rowView, error) {
	id, err := ix.bucketID(s, b)
	if err != nil {
		return 0, rowView{}, err
	}
	if err := ix.get(s, id, row); err != nil {
		return 0, rowView{}, err
	}
	v, err := ix.fmt.decodeRow(row)
	if err != nil {
		return 0, rowView{}, fmt.Errorf("hashindex: table %q: bucket %d, row %d: %w", ix.t.Name(), b, id, err)
	}
	if v.kind != kindBucket || v.number != b || v.level < level {
		return 0, rowView{}, corrupt.Errorf("hashindex: table %q: row %d (kind %d, bucket %d, level %d) is not bucket %d at level %d or more",
			ix.t.Name(), id, v.kind, v.number, v.level, b, level)
	}
	return id, v, nil
}
