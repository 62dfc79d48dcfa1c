package hashindex

import (
	"context"
	"encoding/binary"
	"math/bits"

	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/txnode"
)

// Stats describe an index's shape, as Verify found it.
type Stats struct {
	// Buckets, OverflowRows and DirRows count the index's rows of each kind; with the
	// header they are every row of its table.
	Buckets, OverflowRows, DirRows int
	// Entries counts (key, id) entries.
	Entries int
	// OneRowBuckets counts buckets without overflow rows: a Lookup of their keys reads one
	// row.
	OneRowBuckets int
	// EntriesPerRow is the capacity of a bucket or overflow row.
	EntriesPerRow int
}

// Verify checks the whole index in one read-only transaction and returns its shape: the
// header, the directory, every bucket's level and chain, that each entry is in the bucket
// its hash addresses, no duplicate (a key, on a unique index), and that every row of the
// table is reachable and the header is its lowest. A failure wraps corrupt.ErrCorruption.
// It reads every row and holds a set of their ids: for tests, tools and offline checks.
func (ix *Index) Verify(ctx context.Context) (Stats, error) {
	st, _, err := ix.verify(ctx, false)
	return st, err
}

func (ix *Index) verify(ctx context.Context, collect bool) (Stats, map[string][]uint64, error) {
	var st Stats
	var entries map[string][]uint64
	err := ix.db.View(ctx, func(tx *txnode.Tx) error {
		st, entries = Stats{EntriesPerRow: ix.entries}, nil
		if collect {
			entries = map[string][]uint64{}
		}
		return ix.verifyTx(tx, &st, entries)
	})
	return st, entries, err
}

func (ix *Index) verifyTx(tx *txnode.Tx, st *Stats, entries map[string][]uint64) error {
	s := src{tx: tx}
	row := make([]byte, ix.fmt.rowBytes)
	name := ix.t.Name()
	hd, err := ix.readHeader(s, row)
	if err != nil {
		return err
	}
	reach := map[uint64]bool{ix.headerID: true}
	reached := func(id uint64) error {
		if reach[id] {
			return corrupt.Errorf("hashindex: table %q: row %d is reached twice", name, id)
		}
		reach[id] = true
		return nil
	}
	// The directory.
	n := hd.buckets
	buckets := make([]uint64, 0, min(n, 1<<16)) // grows with the rows read: n is not trusted yet
	id := hd.dirHead
	for d := range hd.dirRows {
		if err := reached(id); err != nil {
			return err
		}
		if err := ix.get(s, id, row); err != nil {
			return err
		}
		v, err := ix.fmt.decodeRow(row)
		if err != nil {
			return err
		}
		want := min(uint64(ix.dirCap), n-d*uint64(ix.dirCap))
		if v.kind != kindDirectory || v.number != d || uint64(v.count) != want {
			return corrupt.Errorf("hashindex: table %q: row %d is not directory row %d of %d entries", name, id, d, want)
		}
		if last := d == hd.dirRows-1; last != (v.next == noRow) || last && id != hd.dirTail {
			return corrupt.Errorf("hashindex: table %q: directory row %d links to %d", name, d, v.next)
		}
		for i := range v.count {
			buckets = append(buckets, binary.LittleEndian.Uint64(v.body[8*i:]))
		}
		id = v.next
	}
	// Every bucket.
	L := uint8(bits.Len64(n) - 1)
	// Every entry of a key is in one bucket's chain (checked below), so duplicates are looked
	// for per chain: the sets hold one chain at a time, not the whole index.
	keys := map[string]bool{}
	pairs := map[string]bool{}
	pair := make([]byte, ix.fmt.keyBytes+8)
	for b, bid := range buckets {
		clear(keys)
		clear(pairs)
		level := L
		if uint64(b) < n-1<<L || uint64(b) >= 1<<L {
			level = L + 1
		}
		if err := reached(bid); err != nil {
			return err
		}
		if err := ix.get(s, bid, row); err != nil {
			return err
		}
		v, err := ix.fmt.decodeRow(row)
		if err != nil {
			return err
		}
		if v.kind != kindBucket || v.number != uint64(b) || v.level != level {
			return corrupt.Errorf("hashindex: table %q: row %d (kind %d, bucket %d, level %d) is not bucket %d at level %d", name, bid, v.kind, v.number, v.level, b, level)
		}
		st.Buckets++
		if v.next == noRow {
			st.OneRowBuckets++
		}
		err = ix.chainFrom(s, bid, v, row, func(rid uint64, v rowView) (bool, error) {
			if v.kind == kindOverflow {
				st.OverflowRows++
				if err := reached(rid); err != nil {
					return false, err
				}
			}
			for i := range v.count {
				k, eid := ix.entry(v.body, i)
				if mask(keyHash(ix.fmt.salt, k), level) != uint64(b) {
					return false, corrupt.Errorf("hashindex: table %q: bucket %d holds a key of another bucket", name, b)
				}
				copy(pair, k)
				binary.LittleEndian.PutUint64(pair[len(k):], eid)
				if pairs[string(pair)] || ix.unique && keys[string(k)] {
					return false, corrupt.Errorf("hashindex: table %q: bucket %d holds a duplicate entry", name, b)
				}
				pairs[string(pair)], keys[string(k)] = true, true
				st.Entries++
				if entries != nil {
					entries[string(k)] = append(entries[string(k)], eid)
				}
			}
			return true, nil
		})
		if err != nil {
			return err
		}
	}
	st.DirRows = int(hd.dirRows)
	// Every row of the table is one of those, and the header is the lowest.
	rows := 0
	for r, err := range tx.ScanAll(ix.t) {
		if err != nil {
			return err
		}
		if rows == 0 && r.ID != ix.headerID {
			return corrupt.Errorf("hashindex: table %q: row %d is below the header %d", name, r.ID, ix.headerID)
		}
		if !reach[r.ID] {
			return corrupt.Errorf("hashindex: table %q: row %d is not reachable from the header", name, r.ID)
		}
		rows++
	}
	if rows != len(reach) {
		return corrupt.Errorf("hashindex: table %q: %d rows reachable, %d in the table", name, len(reach), rows)
	}
	return nil
}
