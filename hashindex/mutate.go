package hashindex

import (
	"bytes"
	"encoding/binary"
	"math/bits"

	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/txnode"
)

// Writes. Every change is a set of row writes in the caller's transaction, so OCC makes it
// atomic and serializable with the rest of the transaction: two inserts of one key read the
// same bucket row and write it, and only one of them can commit.
//
// Invariants, for n buckets with 2^L <= n < 2^(L+1):
//   - bucket b's primary row id never changes and is entry b of the directory;
//   - buckets [n-2^L, 2^L) are at level L, the others at level L+1;
//   - an entry (key, id) is in the chain of bucket mask(keyHash(key), level of that bucket);
//   - an overflow row holds at least one entry (an emptied one is unlinked and deleted);
//   - the header is the table's lowest row id; every row is reachable from it.

// TxInsert adds (key, id) inside tx. On a unique index a key that already has an id fails
// with ErrUniqueViolation; on a non-unique one an (key, id) already held fails with
// ErrEntryExists. The insert reads the key's whole bucket chain (one row in the common
// case) and writes one row; an entry that does not fit the bucket's primary row goes to an
// overflow row (a new one when the chain is full) and splits the next bucket in
// linear-hashing order, in the same transaction.
//
// ErrUniqueViolation, ErrEntryExists and ErrKeySize leave tx unchanged. Any other error may
// leave the index's writes in tx partial: the transaction must be rolled back, never
// committed (DB.Update rolls back when its closure returns the error). The same holds for
// TxDelete, whose ErrNotFound and ErrKeySize leave tx unchanged.
func (ix *Index) TxInsert(tx *txnode.Tx, key []byte, id uint64) error {
	if err := ix.checkKey(key); err != nil {
		return err
	}
	h := keyHash(ix.fmt.salt, key)
	bp := ix.buf()
	defer ix.bufs.Put(bp)
	row := *bp
	s := src{tx: tx}
	var bucket, homeID, homeNext uint64
	freeID := uint64(noRow)
	first := true
	var dup error
	err := ix.chain(s, h, row, func(rid uint64, v rowView) (bool, error) {
		if first {
			bucket, homeID, homeNext, first = v.number, rid, v.next, false
		}
		for i := range v.count {
			k, eid := ix.entry(v.body, i)
			if !bytes.Equal(k, key) {
				continue
			}
			if ix.unique {
				dup = ErrUniqueViolation
				return false, nil
			}
			if eid == id {
				dup = ErrEntryExists
				return false, nil
			}
		}
		if v.count < ix.entries && freeID == noRow {
			freeID = rid
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	if dup != nil {
		return dup
	}
	if freeID != noRow {
		if err := ix.addEntry(s, freeID, row, key, id); err != nil || freeID == homeID {
			return err
		}
		return ix.splitIfWanted(tx, h, row)
	}
	// The chain is full: a new overflow row goes first in the chain, after the primary.
	clear(row)
	ix.putEntry(row, 0, key, id)
	ix.fmt.encodeRow(row, &rowView{kind: kindOverflow, count: 1, number: bucket, next: homeNext})
	oid, err := tx.Insert(ix.t, row)
	if err != nil {
		return err
	}
	if err := ix.get(s, homeID, row); err != nil {
		return err
	}
	v, err := ix.fmt.decodeRow(row)
	if err != nil {
		return err
	}
	v.next = oid
	ix.fmt.encodeRow(row, &v)
	if err := tx.Put(ix.t, homeID, row); err != nil {
		return err
	}
	return ix.splitIfWanted(tx, h, row)
}

// splitIfWanted splits the next bucket after an insert that went to an overflow row, when
// splitWanted says so. Splitting on every such insert (not only when an overflow row is
// added) keeps the load near 0.65 of the primary rows' capacity, at which most buckets
// (about 90% at 9 entries a row) have no overflow row and a lookup reads one row.
func (ix *Index) splitIfWanted(tx *txnode.Tx, h uint64, row []byte) error {
	split, err := ix.splitWanted(src{tx: tx}, h, row)
	if err != nil || !split {
		return err
	}
	return ix.split(tx)
}

// splitWanted reports whether an overflow in hash h's bucket should split a bucket: when
// the chain holds more distinct keys than a row has entries. On a unique index that is
// every overflow; on a non-unique one, a key with many ids (an item kind) fills a chain of
// its own that no split could shorten, so it grows no buckets.
func (ix *Index) splitWanted(s src, h uint64, row []byte) (bool, error) {
	if ix.unique {
		return true, nil
	}
	keys := make(map[string]struct{}, ix.entries+1)
	err := ix.chain(s, h, row, func(_ uint64, v rowView) (bool, error) {
		for i := range v.count {
			k, _ := ix.entry(v.body, i)
			keys[string(k)] = struct{}{}
		}
		return len(keys) <= ix.entries, nil
	})
	return len(keys) > ix.entries, err
}

// putEntry writes entry i of a bucket or overflow row.
func (ix *Index) putEntry(row []byte, i int, key []byte, id uint64) {
	off := rowHeaderBytes + i*(ix.fmt.keyBytes+entryIDBytes)
	copy(row[off:], key)
	binary.LittleEndian.PutUint64(row[off+ix.fmt.keyBytes:], id)
}

// addEntry appends (key, id) to row rid, which has room.
func (ix *Index) addEntry(s src, rid uint64, row, key []byte, id uint64) error {
	if err := ix.get(s, rid, row); err != nil {
		return err
	}
	v, err := ix.fmt.decodeRow(row)
	if err != nil {
		return err
	}
	if v.count >= ix.entries {
		return corrupt.Errorf("hashindex: table %q: row %d filled under its transaction", ix.t.Name(), rid)
	}
	ix.putEntry(row, v.count, key, id)
	v.count++
	ix.fmt.encodeRow(row, &v)
	return s.tx.Put(ix.t, rid, row)
}

// TxDelete removes (key, id) inside tx; it returns ErrNotFound when the index does not hold
// it. An overflow row it empties is unlinked and deleted; buckets are never removed.
func (ix *Index) TxDelete(tx *txnode.Tx, key []byte, id uint64) error {
	if err := ix.checkKey(key); err != nil {
		return err
	}
	h := keyHash(ix.fmt.salt, key)
	bp := ix.buf()
	defer ix.bufs.Put(bp)
	row := *bp
	s := src{tx: tx}
	prevID, foundID, at := uint64(noRow), uint64(noRow), -1
	last := uint64(noRow)
	err := ix.chain(s, h, row, func(rid uint64, v rowView) (bool, error) {
		for i := range v.count {
			if k, eid := ix.entry(v.body, i); eid == id && bytes.Equal(k, key) {
				prevID, foundID, at = last, rid, i
				return false, nil
			}
		}
		last = rid
		return true, nil
	})
	if err != nil {
		return err
	}
	if foundID == noRow {
		return ErrNotFound
	}
	if err := ix.get(s, foundID, row); err != nil {
		return err
	}
	v, err := ix.fmt.decodeRow(row)
	if err != nil {
		return err
	}
	e := ix.fmt.keyBytes + entryIDBytes
	lastOff, atOff := rowHeaderBytes+(v.count-1)*e, rowHeaderBytes+at*e
	copy(row[atOff:atOff+e], row[lastOff:lastOff+e])
	clear(row[lastOff : lastOff+e])
	v.count--
	if v.kind != kindOverflow || v.count > 0 {
		ix.fmt.encodeRow(row, &v)
		return tx.Put(ix.t, foundID, row)
	}
	// The overflow row is empty: unlink it from its predecessor and delete it.
	next := v.next
	if err := tx.Delete(ix.t, foundID); err != nil {
		return err
	}
	if err := ix.get(s, prevID, row); err != nil {
		return err
	}
	if v, err = ix.fmt.decodeRow(row); err != nil {
		return err
	}
	v.next = next
	ix.fmt.encodeRow(row, &v)
	return tx.Put(ix.t, prevID, row)
}

// split splits bucket s = n - 2^L (the next in linear-hashing order) into s and n: the
// entries whose hash has bit L set move to the new bucket, both end at level L+1, the
// directory gains bucket n's row id and the header counts n+1 buckets. It reads and writes
// the header, so concurrent splits conflict and commit one at a time.
func (ix *Index) split(tx *txnode.Tx) error {
	s := src{tx: tx}
	bp := ix.buf()
	defer ix.bufs.Put(bp)
	row := *bp
	hd, err := ix.readHeader(s, row)
	if err != nil {
		return err
	}
	n := hd.buckets
	if n >= 1<<levelMax {
		return nil // the chains just grow
	}
	level := uint8(bits.Len64(n) - 1)
	sb := n - 1<<level
	sid, err := ix.bucketID(s, sb)
	if err != nil {
		return err
	}
	if err := ix.get(s, sid, row); err != nil {
		return err
	}
	v, err := ix.fmt.decodeRow(row)
	if err != nil {
		return err
	}
	if v.kind != kindBucket || v.number != sb || v.level != level {
		return corrupt.Errorf("hashindex: table %q: row %d (kind %d, bucket %d, level %d) is not bucket %d at level %d", ix.t.Name(), sid, v.kind, v.number, v.level, sb, level)
	}
	e := ix.fmt.keyBytes + entryIDBytes
	// Partition each row of the chain in place: a row none of whose entries move is left
	// as it is (unless its next row goes), so a split of a bucket whose keys mostly stay
	// (a non-unique key with many ids, say) writes a few rows, not its whole chain.
	type chainRow struct {
		id      uint64
		stay    []byte // entries that stay, packed
		changed bool
	}
	var rows []chainRow
	var move []byte
	err = ix.chainFrom(s, sid, v, row, func(rid uint64, v rowView) (bool, error) {
		cr := chainRow{id: rid, changed: v.kind == kindBucket} // the primary's level changes
		for i := range v.count {
			ent := v.body[i*e : (i+1)*e]
			hk := keyHash(ix.fmt.salt, ent[:ix.fmt.keyBytes])
			if mask(hk, level) != sb {
				return false, corrupt.Errorf("hashindex: table %q: bucket %d holds a key of bucket %d", ix.t.Name(), sb, mask(hk, level))
			}
			if hk>>level&1 == 0 {
				cr.stay = append(cr.stay, ent...)
			} else {
				move = append(move, ent...)
				cr.changed = true
			}
		}
		rows = append(rows, cr)
		return true, nil
	})
	if err != nil {
		return err
	}
	// Overflow rows left empty go; the row before each gone run links past it.
	kept := rows[:1]
	for _, cr := range rows[1:] {
		if len(cr.stay) == 0 {
			if err := tx.Delete(ix.t, cr.id); err != nil {
				return err
			}
			kept[len(kept)-1].changed = true
			continue
		}
		kept = append(kept, cr)
	}
	for k, cr := range kept {
		if !cr.changed {
			continue
		}
		clear(row)
		copy(row[rowHeaderBytes:], cr.stay)
		v := rowView{kind: kindOverflow, count: len(cr.stay) / e, number: sb}
		if k == 0 {
			v.kind, v.level = kindBucket, level+1
		}
		if k+1 < len(kept) {
			v.next = kept[k+1].id
		}
		ix.fmt.encodeRow(row, &v)
		if err := tx.Put(ix.t, cr.id, row); err != nil {
			return err
		}
	}
	nid, err := ix.writeBucket(tx, row, nil, n, level+1, move)
	if err != nil {
		return err
	}
	// Append bucket n to the directory's tail row, or to a new one.
	if err := ix.get(s, hd.dirTail, row); err != nil {
		return err
	}
	tail, err := ix.fmt.decodeRow(row)
	if err != nil {
		return err
	}
	if tail.kind != kindDirectory || tail.number != hd.dirRows-1 || (hd.dirRows-1)*uint64(ix.dirCap)+uint64(tail.count) != n {
		return corrupt.Errorf("hashindex: table %q: directory tail row %d does not end at bucket %d", ix.t.Name(), hd.dirTail, n)
	}
	if tail.count < ix.dirCap {
		binary.LittleEndian.PutUint64(row[rowHeaderBytes+8*tail.count:], nid)
		tail.count++
		ix.fmt.encodeRow(row, &tail)
		if err := tx.Put(ix.t, hd.dirTail, row); err != nil {
			return err
		}
	} else {
		clear(row)
		binary.LittleEndian.PutUint64(row[rowHeaderBytes:], nid)
		ix.fmt.encodeRow(row, &rowView{kind: kindDirectory, count: 1, number: hd.dirRows})
		did, err := tx.Insert(ix.t, row)
		if err != nil {
			return err
		}
		if err := ix.get(s, hd.dirTail, row); err != nil {
			return err
		}
		tail.next = did
		ix.fmt.encodeRow(row, &tail)
		if err := tx.Put(ix.t, hd.dirTail, row); err != nil {
			return err
		}
		hd.dirTail = did
		hd.dirRows++
	}
	hd.buckets++
	hd.encode(row)
	return tx.Put(ix.t, ix.headerID, row)
}

// writeBucket writes bucket b at level with entries (packed, keyBytes+8 each) into the rows
// of ids (primary first, reused in order; extra ones deleted), inserting the rows it lacks,
// and returns the primary row's id. A split writes its new bucket with it (ids nil).
func (ix *Index) writeBucket(tx *txnode.Tx, row []byte, ids []uint64, b uint64, level uint8, entries []byte) (uint64, error) {
	e := ix.fmt.keyBytes + entryIDBytes
	perRow := ix.entries * e
	rows := max(1, (len(entries)+perRow-1)/perRow)
	all := make([]uint64, rows)
	copy(all, ids)
	for k := rows - 1; k >= 0; k-- { // last first: each row points at the next
		part := entries[min(len(entries), k*perRow):min(len(entries), (k+1)*perRow)]
		clear(row)
		copy(row[rowHeaderBytes:], part)
		v := rowView{kind: kindOverflow, count: len(part) / e, number: b}
		if k == 0 {
			v.kind, v.level = kindBucket, level
		}
		if k+1 < rows {
			v.next = all[k+1]
		}
		ix.fmt.encodeRow(row, &v)
		if k < len(ids) {
			if err := tx.Put(ix.t, all[k], row); err != nil {
				return 0, err
			}
			continue
		}
		id, err := tx.Insert(ix.t, row)
		if err != nil {
			return 0, err
		}
		all[k] = id
	}
	for _, id := range ids[min(len(ids), rows):] {
		if err := tx.Delete(ix.t, id); err != nil {
			return 0, err
		}
	}
	return all[0], nil
}
