package hashindex

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/txnode"
)

// Options configure Create. The key size and uniqueness are fixed for the index's life.
type Options struct {
	// KeyBytes is the size of every key, 1..KeyBytesMax (a player name padded to 16 bytes,
	// an item kind as 4).
	KeyBytes int
	// Unique makes Insert fail with ErrUniqueViolation for a key that already has an id.
	Unique bool
	// RowBytes is the bucket row size: a multiple of 8 in [64, RowBytesMax] with room for
	// at least one entry. Zero picks DefaultRowBytes(KeyBytes).
	RowBytes int
	// Buckets presizes the index to at least this many buckets (rounded up to a power of
	// two), for a table whose size is known; zero starts with one bucket. Create writes
	// them in one transaction, so Buckets*RowBytes is at most 4 MiB (its commit batch, and
	// the pages it pins, must fit the store's batch limit and the cache).
	//
	// Growth needs no presizing: each split adds one bucket.
	Buckets int
}

// createBytesMax bounds the rows Create writes in its one transaction.
const createBytesMax = 4 << 20

// DefaultRowBytes is the bucket row size Create picks for keys of keyBytes: the smallest
// multiple of 64 bytes (a CPU cache line) holding 8 entries, at most RowBytesMax. Eight
// entries a row keep linear hashing's split-on-overflow at a load of about 0.7 with most
// buckets in one row, so a lookup is one row Get; a larger row would make every lookup copy
// (and checksum) more bytes for fewer overflow rows that are already rare.
func DefaultRowBytes(keyBytes int) int {
	r := (rowHeaderBytes + 8*(keyBytes+entryIDBytes) + 63) &^ 63
	return min(r, RowBytesMax)
}

// Index is a hash index from fixed-size keys to row ids, stored in its own table. Its
// methods may be called from any goroutine; the Tx forms from the goroutine running the Tx.
type Index struct {
	db       *txnode.DB
	t        *txnode.Table
	headerID uint64 // the table's first row
	fmt      rowFormat
	unique   bool
	entries  int // entries per bucket or overflow row
	dirCap   int // bucket row ids per directory row

	dir   atomic.Pointer[dirCache] // committed directory, append-only
	dirMu chan struct{}            // of one: serialises refreshes of dir, a wait that honours ctx
	bufs  sync.Pool                // *[]byte of the row size
}

// Create creates the index's table (named name, of the bucket row size) and writes an empty
// index: a header, the first directory row and opts.Buckets empty buckets.
func Create(ctx context.Context, db *txnode.DB, name string, opts Options) (*Index, error) {
	if opts.KeyBytes < 1 || opts.KeyBytes > KeyBytesMax {
		return nil, fmt.Errorf("%w: key size %d, want 1..%d", ErrOptions, opts.KeyBytes, KeyBytesMax)
	}
	if opts.RowBytes == 0 {
		opts.RowBytes = DefaultRowBytes(opts.KeyBytes)
	}
	if opts.RowBytes < headerBytes || opts.RowBytes > RowBytesMax || opts.RowBytes%8 != 0 || entriesPerRow(opts.RowBytes, opts.KeyBytes) < 1 {
		return nil, fmt.Errorf("%w: row size %d for %d-byte keys", ErrOptions, opts.RowBytes, opts.KeyBytes)
	}
	if most := createBytesMax / opts.RowBytes; opts.Buckets < 0 || opts.Buckets > most {
		return nil, fmt.Errorf("%w: %d initial buckets of %d bytes, want 0..%d (one transaction writes them)", ErrOptions, opts.Buckets, opts.RowBytes, most)
	}
	level := uint8(0)
	if opts.Buckets > 1 {
		level = uint8(bits.Len64(uint64(opts.Buckets - 1)))
	}
	salt, err := newSalt()
	if err != nil {
		return nil, err
	}
	table, err := db.CreateTable(ctx, name, opts.RowBytes)
	if err != nil {
		return nil, err
	}
	ix := newIndex(db, table, header{keyBytes: opts.KeyBytes, unique: opts.Unique, salt: salt})
	err = db.Update(ctx, func(tx *txnode.Tx) error { return ix.create(tx, uint64(1)<<level, level) })
	if err != nil {
		// Nothing uses the table yet; an index without a header would only fail Open.
		return nil, errors.Join(fmt.Errorf("hashindex: create %q: %w", name, err), db.DropTable(ctx, name))
	}
	if err := ix.refresh(ctx, false); err != nil {
		return nil, err
	}
	return ix, nil
}

// newSalt draws an index's hash salt; tests replace it to replay a seed.
var newSalt = func() (uint64, error) {
	var b [8]byte
	_, err := rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]), err
}

// create writes the header first (so it is the table's lowest row id), then n buckets at
// level, then the directory.
func (ix *Index) create(tx *txnode.Tx, n uint64, level uint8) error {
	row := make([]byte, ix.fmt.rowBytes)
	h := header{keyBytes: ix.fmt.keyBytes, unique: ix.unique, salt: ix.fmt.salt, buckets: n}
	h.encode(row)
	var err error
	if ix.headerID, err = tx.Insert(ix.t, row); err != nil {
		return err
	}
	ids := make([]uint64, n)
	for b := range n {
		clear(row)
		ix.fmt.encodeRow(row, &rowView{kind: kindBucket, level: level, number: b})
		if ids[b], err = tx.Insert(ix.t, row); err != nil {
			return err
		}
	}
	// Directory rows, last first, so each can point at the next.
	next := uint64(noRow)
	for d := (int(n) - 1) / ix.dirCap; d >= 0; d-- {
		part := ids[d*ix.dirCap : min(len(ids), (d+1)*ix.dirCap)]
		clear(row)
		for i, id := range part {
			binary.LittleEndian.PutUint64(row[rowHeaderBytes+8*i:], id)
		}
		ix.fmt.encodeRow(row, &rowView{kind: kindDirectory, count: len(part), number: uint64(d), next: next})
		id, err := tx.Insert(ix.t, row)
		if err != nil {
			return err
		}
		if next == noRow {
			h.dirTail = id
		}
		next = id
		h.dirRows++
	}
	h.dirHead = next
	h.encode(row)
	return tx.Put(ix.t, ix.headerID, row)
}

// Open opens an existing index: its table (taking its write ownership) and header. A table
// that is not an index of this format fails with an error wrapping corrupt.ErrCorruption.
func Open(ctx context.Context, db *txnode.DB, name string) (*Index, error) {
	table, err := db.Table(ctx, name)
	if err != nil {
		return nil, err
	}
	// The header is the table's lowest row id: in the first page for an index Create made,
	// so scan windows of doubling size from id 0 rather than the whole table (a scan
	// fetches its pages in batches, which a small cache may not hold).
	for lo, hi := uint64(0), uint64(64); ; lo, hi = hi, 2*hi {
		if hi > math.MaxUint64/2 {
			hi = math.MaxUint64
		}
		for r, err := range table.Scan(ctx, lo, hi) {
			if err != nil {
				return nil, fmt.Errorf("hashindex: open %q: %w", name, err)
			}
			h, err := decodeHeader(r.Data)
			if err != nil {
				return nil, fmt.Errorf("hashindex: open %q: row %d: %w", name, r.ID, err)
			}
			ix := newIndex(db, table, h)
			ix.headerID = r.ID
			if err := ix.refresh(ctx, false); err != nil {
				return nil, fmt.Errorf("hashindex: open %q: %w", name, err)
			}
			return ix, nil
		}
		if hi == math.MaxUint64 {
			break
		}
	}
	return nil, corrupt.Errorf("hashindex: open %q: the table is empty, not an index", name)
}

func newIndex(db *txnode.DB, table *txnode.Table, h header) *Index {
	rb := table.RowBytes()
	ix := &Index{
		db: db, t: table, unique: h.unique,
		fmt:     newRowFormat(rb, h.keyBytes, h.salt),
		entries: entriesPerRow(rb, h.keyBytes),
		dirCap:  dirEntriesPerRow(rb),
	}
	ix.dir.Store(&dirCache{})
	ix.dirMu = make(chan struct{}, 1)
	ix.bufs.New = func() any { b := make([]byte, rb); return &b }
	return ix
}

// Table returns the index's table.
func (ix *Index) Table() *txnode.Table { return ix.t }

// KeyBytes returns the index's key size.
func (ix *Index) KeyBytes() int { return ix.fmt.keyBytes }

// Key returns s as a key of the index: its bytes, zero-padded to KeyBytes, in a new slice
// (a player name for a 16-byte key). A longer s fails with ErrKeySize, since a truncated
// name would collide with others; so s must not end in zero bytes of its own.
func (ix *Index) Key(s string) ([]byte, error) {
	if len(s) > ix.fmt.keyBytes {
		return nil, fmt.Errorf("%w: %q is %d bytes, index %q has %d-byte keys", ErrKeySize, s, len(s), ix.t.Name(), ix.fmt.keyBytes)
	}
	k := make([]byte, ix.fmt.keyBytes)
	copy(k, s)
	return k, nil
}

// Unique reports whether the index is unique.
func (ix *Index) Unique() bool { return ix.unique }

// src reads rows of the index: in a transaction (tx set) or one consistent row at a time.
type src struct {
	ctx context.Context
	tx  *txnode.Tx
}

func (ix *Index) get(s src, id uint64, dst []byte) error {
	var err error
	if s.tx != nil {
		err = s.tx.Get(ix.t, id, dst)
	} else {
		err = ix.t.Get(s.ctx, id, dst)
	}
	if errors.Is(err, txnode.ErrNotFound) {
		return corrupt.Errorf("hashindex: table %q: row %d is missing", ix.t.Name(), id)
	}
	return err
}

func (ix *Index) buf() *[]byte { return ix.bufs.Get().(*[]byte) }

func (ix *Index) checkKey(key []byte) error {
	if len(key) != ix.fmt.keyBytes {
		return fmt.Errorf("%w: %d-byte key, index %q has %d-byte keys", ErrKeySize, len(key), ix.t.Name(), ix.fmt.keyBytes)
	}
	return nil
}

// readHeader reads and checks the header: its fixed fields must be the ones opened.
func (ix *Index) readHeader(s src, row []byte) (header, error) {
	if err := ix.get(s, ix.headerID, row); err != nil {
		return header{}, err
	}
	h, err := decodeHeader(row)
	if err != nil {
		return h, err
	}
	if h.keyBytes != ix.fmt.keyBytes || h.unique != ix.unique || h.salt != ix.fmt.salt {
		return h, corrupt.Errorf("hashindex: table %q: header changed under an open index", ix.t.Name())
	}
	return h, nil
}

// Lookup returns the id of key: on a unique index its only one, on a non-unique one the
// first in bucket order (IDs gives them all). It returns ErrNotFound when the key has none.
// Outside a transaction it is linearizable: a key in its bucket's primary row, or absent
// from a bucket without overflow rows (the common cases), is read with one lock-free row
// Get and no allocation on a cache hit; otherwise the chain is read in a read-only
// transaction.
func (ix *Index) Lookup(ctx context.Context, key []byte) (uint64, error) {
	if len(key) != ix.fmt.keyBytes {
		return 0, ix.checkKey(key)
	}
	var h uint64
	if len(key) == 16 {
		h = keyHash16(ix.fmt.salt, binary.LittleEndian.Uint64(key), binary.LittleEndian.Uint64(key[8:]))
	} else {
		h = keyHash(ix.fmt.salt, key)
	}
	// The home row is one committed state of the bucket: a key found in it was indexed at
	// that moment, and so was a key missing from a bucket without overflow rows.
	switch id, r := ix.lookupFast(ctx, h, key); r {
	case fastFound:
		return id, nil
	case fastAbsent:
		return 0, ErrNotFound
	case fastChain:
		return ix.lookupTx(ctx, key)
	}
	bp := ix.buf()
	defer ix.bufs.Put(bp)
	_, v, err := ix.home(src{ctx: ctx}, h, *bp)
	if err != nil {
		return 0, err
	}
	for i := range v.count {
		if k, id := ix.entry(v.body, i); bytes.Equal(k, key) {
			return id, nil
		}
	}
	if v.next == noRow {
		return 0, ErrNotFound
	}
	return ix.lookupTx(ctx, key)
}

// lookupTx is Lookup of a key whose bucket has overflow rows: the chain is read in a
// read-only transaction, retried on conflict like View (without View's closure, which would
// allocate).
func (ix *Index) lookupTx(ctx context.Context, key []byte) (uint64, error) {
	for attempt := 0; ; attempt++ {
		tx, err := ix.db.Begin(ctx, false)
		if err != nil {
			return 0, err
		}
		id, err := ix.TxLookup(tx, key)
		cerr := tx.Commit()
		if errors.Is(cerr, txnode.ErrConflict) && attempt < txnode.DefaultMaxRetries {
			continue // what it read changed under it, an error from it included
		}
		if err == nil {
			err = cerr
		}
		return id, err
	}
}

// TxLookup returns the id of key inside tx, like Lookup: the bucket rows it reads are part
// of tx, so a concurrent Insert or Delete of a key of the same bucket fails tx's commit.
func (ix *Index) TxLookup(tx *txnode.Tx, key []byte) (uint64, error) {
	if err := ix.checkKey(key); err != nil {
		return 0, err
	}
	bp := ix.buf()
	defer ix.bufs.Put(bp)
	found, id := false, uint64(0)
	err := ix.chain(src{tx: tx}, keyHash(ix.fmt.salt, key), *bp, func(_ uint64, v rowView) (bool, error) {
		for i := range v.count {
			if k, eid := ix.entry(v.body, i); bytes.Equal(k, key) {
				found, id = true, eid
				return false, nil
			}
		}
		return true, nil
	})
	if err == nil && !found {
		err = ErrNotFound
	}
	return id, err
}

// IDs returns the ids of key in bucket order. A bucket of one row (the common case) is read
// with one lock-free row Get, so the ids are one committed state; a longer chain is read in
// a read-only transaction of its own that ends with the sequence, each row consistent but,
// like txnode's Table.Scan, the sequence as a whole not a snapshot (TxIDs is). An error
// ends the sequence as its last element.
func (ix *Index) IDs(ctx context.Context, key []byte) iter.Seq2[uint64, error] {
	return func(yield func(uint64, error) bool) {
		if err := ix.checkKey(key); err != nil {
			yield(0, err)
			return
		}
		bp := ix.buf()
		_, v, err := ix.home(src{ctx: ctx}, keyHash(ix.fmt.salt, key), *bp)
		if err != nil || v.next == noRow {
			defer ix.bufs.Put(bp)
			if err != nil {
				yield(0, err)
				return
			}
			for i := range v.count {
				if k, id := ix.entry(v.body, i); bytes.Equal(k, key) && !yield(id, nil) {
					return
				}
			}
			return
		}
		ix.bufs.Put(bp)
		tx, err := ix.db.Begin(ctx, false)
		if err != nil {
			yield(0, err)
			return
		}
		defer tx.Rollback()
		for id, err := range ix.TxIDs(tx, key) {
			if !yield(id, err) {
				return
			}
		}
	}
}

// TxIDs returns the ids of key in bucket order as part of tx: serializable, tx's own
// inserts and deletes seen. An error ends the sequence as its last element.
func (ix *Index) TxIDs(tx *txnode.Tx, key []byte) iter.Seq2[uint64, error] {
	return func(yield func(uint64, error) bool) {
		if err := ix.checkKey(key); err != nil {
			yield(0, err)
			return
		}
		bp := ix.buf()
		defer ix.bufs.Put(bp)
		stopped := false
		err := ix.chain(src{tx: tx}, keyHash(ix.fmt.salt, key), *bp, func(_ uint64, v rowView) (bool, error) {
			for i := range v.count {
				if k, id := ix.entry(v.body, i); bytes.Equal(k, key) && !yield(id, nil) {
					stopped = true
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil && !stopped {
			yield(0, err)
		}
	}
}

// Insert adds (key, id) in a transaction of its own (DB.Update, retried on conflict).
func (ix *Index) Insert(ctx context.Context, key []byte, id uint64) error {
	return ix.db.Update(ctx, func(tx *txnode.Tx) error { return ix.TxInsert(tx, key, id) })
}

// Delete removes (key, id) in a transaction of its own (DB.Update, retried on conflict).
func (ix *Index) Delete(ctx context.Context, key []byte, id uint64) error {
	return ix.db.Update(ctx, func(tx *txnode.Tx) error { return ix.TxDelete(tx, key, id) })
}
