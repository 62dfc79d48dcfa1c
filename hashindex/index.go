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
