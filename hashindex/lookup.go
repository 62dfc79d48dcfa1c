package hashindex

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"

	"github.com/weftdb/weft/internal/corrupt"
)

// Reading buckets: Lookup's cache-hit fast path, on the primary row in place in the cache,
// and the general walk of a bucket's chain that lookups, writes and Verify share.

// fastResult is what Lookup's fast path found.
type fastResult uint8

const (
	fastSlow   fastResult = iota // anything unusual: the general path decides
	fastFound                    // the key, in its bucket's primary row
	fastAbsent                   // not in its bucket, which has no overflow rows
	fastChain                    // not in the primary row, which has overflow rows
)

// lookupFast is Lookup's cache-hit path: the primary row of h's bucket, by the directory
// snapshot, read in place in the cache (txnode's Table.ViewVersion: no copy) and searched.
// Its checksum is checked there unless the row's version is the one last verified
// (dirSlot.checked), which is then recorded; its fields must be those of the bucket.
// Anything else (a bad checksum, a bucket split since the snapshot, an error) returns
// fastSlow, and the general path reads the row again and checks it all.
func (ix *Index) lookupFast(ctx context.Context, h uint64, key []byte) (uint64, fastResult) {
	c := ix.dir.Load()
	b, level := address(h, c.n)
	if b >= uint64(len(c.slots)) {
		return 0, fastSlow
	}
	sl := &c.slots[b]
	id, r, memo := uint64(0), fastSlow, uint64(0)
	// View's rules: fn may run again (it only sets id, r and memo, each run overwriting
	// them), must not fail on any bytes (count is bounded before it slices) and keeps
	// nothing of row.
	err := ix.t.ViewVersion(ctx, sl.id, func(row []byte, ver uint64) error {
		id, r, memo = ix.probeBucket(sl, b, level, h, key, row, ver)
		return nil
	})
	if err != nil {
		return 0, fastSlow
	}
	if memo != 0 {
		// The run that counted saw the bytes of that version: verified. A store into an
		// array that appendSlot replaced since is lost (one more checksum).
		atomic.StoreUint64(&sl.checked, memo)
	}
	return id, r
}

// probeBucket is lookupFast's search of bucket b's primary row (its slot sl), row (in the
// cache) at version ver. memo is not 0 when it checked the row's checksum (ver was not the
// version verified last): memoOf(ver), for lookupFast to record once the run counts.
func (ix *Index) probeBucket(sl *dirSlot, b uint64, level uint8, h uint64, key, row []byte, ver uint64) (id uint64, r fastResult, memo uint64) {
	if len(row) != ix.fmt.rowBytes || len(row) < rowHeaderBytes {
		return 0, fastSlow, 0
	}
	lv, count := row[5], int(binary.LittleEndian.Uint16(row[6:]))
	if row[4] != kindBucket || lv < level || lv > levelMax || count > ix.entries ||
		binary.LittleEndian.Uint64(row[8:]) != b || mask(h, lv) != b {
		return 0, fastSlow, 0
	}
	if m := memoOf(ver); atomic.LoadUint64(&sl.checked) != m {
		if binary.LittleEndian.Uint32(row) != ix.fmt.rowSum(row) {
			return 0, fastSlow, 0
		}
		memo = m
	}
	found := false
	if ix.fmt.keyBytes == 16 {
		k0, k1 := binary.LittleEndian.Uint64(key), binary.LittleEndian.Uint64(key[8:])
		end := rowHeaderBytes + count*24
		_ = row[end-1] // count <= entries: the entries are in the row
		for off := rowHeaderBytes; off < end; off += 24 {
			w := (*[24]byte)(row[off : off+24])
			if binary.LittleEndian.Uint64(w[0:]) == k0 && binary.LittleEndian.Uint64(w[8:]) == k1 {
				id, found = binary.LittleEndian.Uint64(w[16:]), true
				break
			}
		}
	} else {
		e, kb := ix.fmt.entryBytes, ix.fmt.keyBytes
		body := row[rowHeaderBytes : rowHeaderBytes+count*e]
		for off := 0; off+e <= len(body); off += e {
			if string(body[off:off+kb]) == string(key) {
				id, found = binary.LittleEndian.Uint64(body[off+kb:]), true
				break
			}
		}
	}
	switch {
	case found:
		return id, fastFound, memo
	case binary.LittleEndian.Uint64(row[16:]) == noRow:
		return 0, fastAbsent, memo
	}
	return 0, fastChain, memo
}

// entry returns entry i of a bucket or overflow row's body.
func (ix *Index) entry(body []byte, i int) (key []byte, id uint64) {
	e := ix.fmt.keyBytes + entryIDBytes
	return body[i*e : i*e+ix.fmt.keyBytes], binary.LittleEndian.Uint64(body[i*e+ix.fmt.keyBytes:])
}

// chain calls fn for the home row and every overflow row of hash h's bucket, in chain
// order, each decoded in row (valid until fn returns). fn returns false to stop.
func (ix *Index) chain(s src, h uint64, row []byte, fn func(id uint64, v rowView) (bool, error)) error {
	id, v, err := ix.home(s, h, row)
	if err != nil {
		return err
	}
	return ix.chainFrom(s, id, v, row, fn)
}

// chainFrom calls fn for the bucket row v (read from row id into row) and then for each
// row of its overflow chain, like chain.
func (ix *Index) chainFrom(s src, id uint64, v rowView, row []byte, fn func(id uint64, v rowView) (bool, error)) error {
	bucket := v.number
	// Brent's cycle detection: a damaged chain that loops is reported after at most about
	// three times its length in steps, with no memory.
	saved, power, steps := id, 1, 0
	for {
		more, err := fn(id, v)
		if err != nil || !more || v.next == noRow {
			return err
		}
		id = v.next
		if id == saved {
			return corrupt.Errorf("hashindex: table %q: bucket %d: overflow chain loops at row %d", ix.t.Name(), bucket, id)
		}
		if steps++; steps == power {
			saved, power, steps = id, power*2, 0
		}
		if err := ix.get(s, id, row); err != nil {
			return err
		}
		if v, err = ix.fmt.decodeRow(row); err != nil {
			return fmt.Errorf("hashindex: table %q: bucket %d, overflow row %d: %w", ix.t.Name(), bucket, id, err)
		}
		if v.kind != kindOverflow || v.number != bucket {
			return corrupt.Errorf("hashindex: table %q: row %d (kind %d, bucket %d) in the overflow chain of bucket %d", ix.t.Name(), id, v.kind, v.number, bucket)
		}
	}
}
