package txnode

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/weftdb/weft/logicpage"
)

// Concurrency control is optimistic and serializable, in the style of Silo: a transaction
// reads rows without locks, recording each row's version word (and, for scans, each page's
// version and the table's insert epoch); at commit it locks the rows it writes in a global
// order, checks that nothing it read has changed, takes the next value of the commit counter,
// hands its rows to the commit pipeline, installs them and unlocks. Pages a transaction
// touches are pinned until it ends, so no frame it depends on is evicted under it.

// Tx is a transaction. It is not safe for concurrent use: one goroutine runs it. It is valid
// only inside the closure it was handed to (DB.Update, View, Session.Go) or, from Begin,
// until Commit or Rollback; after that every method returns ErrTxDone, for ever. Row slices
// it hands out (a scan's Row.Data, the row an Update's fn gets) are valid as their own docs
// say, never after the transaction ends.
type Tx struct {
	db       *DB
	ctx      context.Context
	writable bool
	done     bool
	manual   bool // from Begin: never returned to the pool
	// exposed: handed to a user's closure (DB.Update, View, Session.Go), which may keep the
	// pointer: release retires this Tx for ever (done) and pools a fresh one with its buffers.
	exposed bool

	pins      []*frameMeta
	pinBytes  int64                 // what the pinned frames cost in the cache (frameCost of each)
	pinIndex  map[uint64]*frameMeta // by page key, once pins is long
	reads     []readRec
	pageReads []pageRec
	insReads  []insRec
	writes    []writeRec
	wIndex    map[rowKey]int32
	buf       []byte // images of written rows
	scratch   []byte
	maxRead   uint64 // highest version read
	readsFrom bool   // read any row (for the durability wait)
	// bumped lists the tables whose insert epoch this transaction's commit bumped (once
	// each, with its write set locked): validation discounts its own bumps.
	bumped []*tableState
	// busy is the page the transaction could not pin, the cache being full while it held
	// others (errCacheBusy): its retry loop rolls it back and parks for the cache turn.
	busy busyPage
	// turn: this attempt holds the cache turn (it may wait for frames while holding some).
	turn bool
	// leased lists the tables whose lease this transaction checked (tx.serving): the lease
	// clock is read once per table when the transaction first touches it and once more at
	// commit, not once per row.
	leased []*tableState
}

type busyPage struct {
	t    *tableState
	page uint64
}

type rowKey struct {
	table uint32
	id    uint64
}

type readRec struct {
	m    *frameMeta
	slot uint8
	ver  uint64
}

type pageRec struct {
	m   *frameMeta
	ver uint64
}

type insRec struct {
	t     *tableState
	epoch uint64
}

type writeRec struct {
	t      *tableState
	id     uint64
	m      *frameMeta
	off    int32 // offset of the row image in buf; -1 for a delete
	insert bool
	locked bool
	prev   uint64 // the row's version word when we locked it
}

const wIndexMin = 16 // below this many writes a linear search beats a map

func (db *DB) beginTx(ctx context.Context, writable bool) (*Tx, error) {
	if db.closed.Load() {
		return nil, ErrClosed
	}
	tx := db.txPool.Get().(*Tx)
	tx.ctx, tx.writable, tx.done = ctx, writable, false
	return tx, nil
}

// unpinAll releases every pinned frame.
func (tx *Tx) unpinAll() {
	for _, m := range tx.pins {
		tx.db.cache.unpin(m)
	}
	clear(tx.pins)
	tx.pins = tx.pins[:0]
	tx.pinBytes = 0
	if tx.pinIndex != nil {
		clear(tx.pinIndex)
	}
}

// release unpins everything and returns the Tx to the pool.
func (tx *Tx) release() {
	tx.unpinAll()
	clear(tx.reads)
	tx.reads = tx.reads[:0]
	clear(tx.pageReads)
	tx.pageReads = tx.pageReads[:0]
	clear(tx.insReads)
	tx.insReads = tx.insReads[:0]
	clear(tx.writes)
	tx.writes = tx.writes[:0]
	if tx.wIndex != nil {
		clear(tx.wIndex)
	}
	tx.buf = tx.buf[:0]
	clear(tx.bumped)
	tx.bumped = tx.bumped[:0]
	clear(tx.leased)
	tx.leased = tx.leased[:0]
	tx.maxRead, tx.readsFrom = 0, false
	tx.busy = busyPage{}
	tx.turn = false
	tx.done = true
	tx.ctx = nil
	if tx.manual {
		return
	}
	if tx.exposed {
		// The closure's caller may still hold tx: it stays done for ever, and its buffers
		// move to a new Tx for the pool (one small allocation per exposed transaction).
		fresh := new(Tx)
		*fresh = *tx
		fresh.exposed = false
		*tx = Tx{db: tx.db, done: true, manual: true}
		tx = fresh
	}
	tx.db.txPool.Put(tx)
}

func (tx *Tx) findWrite(table uint32, id uint64) int {
	if tx.wIndex != nil {
		if i, ok := tx.wIndex[rowKey{table, id}]; ok {
			return int(i)
		}
		return -1
	}
	for i := range tx.writes {
		if tx.writes[i].id == id && tx.writes[i].t.id == table {
			return i
		}
	}
	return -1
}

func (tx *Tx) addWrite(w writeRec) {
	tx.writes = append(tx.writes, w)
	n := len(tx.writes)
	switch {
	case tx.wIndex != nil:
		tx.wIndex[rowKey{w.t.id, w.id}] = int32(n - 1)
	case n >= wIndexMin:
		tx.wIndex = make(map[rowKey]int32, 2*n)
		for i, w := range tx.writes {
			tx.wIndex[rowKey{w.t.id, w.id}] = int32(i)
		}
	}
}

// pinPage pins the frame of (t, page) for the rest of the transaction; fresh is as for
// pageCache.pin.
func (tx *Tx) pinPage(t *tableState, page uint64, fresh uint64) (*frameMeta, error) {
	key := pageKey(t.id, page)
	if tx.pinIndex != nil {
		if m := tx.pinIndex[key]; m != nil {
			return m, nil
		}
	} else {
		for _, m := range tx.pins {
			if m.key.Load() == key {
				return m, nil
			}
		}
	}
	// With the cache full, a transaction holding pins may be told to let go (errCacheBusy):
	// its retry loop rolls it back and waits with nothing pinned (retryBusy). A manual
	// transaction has no loop: Commit then fails with ErrCacheFull.
	_, m, err := tx.db.cache.pinAs(tx.ctx, key, t.rowBytes, fresh, len(tx.pins), tx.pinBytes, tx.turn)
	if err != nil {
		if err == errCacheBusy {
			tx.busy = busyPage{t: t, page: page}
		}
		return nil, err
	}
	tx.pins = append(tx.pins, m)
	tx.pinBytes += frameCost(t.rowBytes)
	switch {
	case tx.pinIndex != nil:
		tx.pinIndex[key] = m
	case len(tx.pins) >= wIndexMin:
		tx.pinIndex = make(map[uint64]*frameMeta, 2*len(tx.pins))
		for _, m := range tx.pins {
			tx.pinIndex[m.key.Load()] = m
		}
	}
	return m, nil
}

// readRow reads row id of t as r says (copies it, views it, or only checks it exists) and
// records its version. It reports whether the row exists; an error after the read was
// recorded is r's function's.
func (tx *Tx) readRow(t *tableState, id uint64, r rowRead) (bool, error) {
	if err := tx.serving(t); err != nil {
		return false, err
	}
	if id >= t.idHigh.Load() {
		// Never granted: no row, and no page to pin (its number would not fit a page key).
		// An insert of it before commit is a phantom, as for a scan past the high-water mark
		// (see scan for the order of the loads).
		epoch := t.insertEpoch.Load()
		if id >= t.idHigh.Load() {
			tx.insReads = append(tx.insReads, insRec{t: t, epoch: epoch})
			return false, nil
		}
	}
	page, slot := logicpage.PageOf(id)
	m, err := tx.pinPage(t, page, 0)
	if err != nil {
		return false, err
	}
	bit := uint64(1) << slot
	versions, rows := frameWords(m, t.rowBytes)
	fetched := false // a miss (counted by fetch), else a hit (t.cnt)
	for {
		v1 := atomic.LoadUint64(&versions[slot])
		if v1&versionLock != 0 {
			// A committer installs it (or a fill writes it): park, do not spin, and do not
			// fetch a slot that is being written (the fill would skip it).
			if err := tx.db.cache.rows.wait(tx.ctx, m, slot, &versions[slot]); err != nil {
				return false, err
			}
			continue
		}
		if m.valid.Load()&bit == 0 {
			if err := tx.db.fetch(tx.ctx, t, m, page, bit); err != nil {
				return false, err
			}
			fetched = true
			continue
		}
		present := m.present.Load()&bit != 0
		var ferr error
		if present {
			off := slot * t.rowBytes
			if row := rows[off : off+t.rowBytes : off+t.rowBytes]; r.mode == readCopy {
				logicpage.LoadRow(r.dst, row)
			} else if r.mode != readExists {
				ferr = r.view(row, true, v1)
			}
		}
		if atomic.LoadUint64(&versions[slot]) != v1 || m.valid.Load()&bit == 0 {
			continue
		}
		tx.reads = append(tx.reads, readRec{m: m, slot: uint8(slot), ver: v1})
		tx.maxRead = max(tx.maxRead, v1)
		tx.readsFrom = true
		if !fetched {
			t.cnt.txHit()
		}
		return present, ferr
	}
}

// checkWrite checks that the transaction may write t.
func (tx *Tx) checkWrite(t *tableState) error {
	if tx.done {
		return ErrTxDone
	}
	if !tx.writable {
		return ErrReadOnly
	}
	return tx.serving(t)
}

// serving is t.serving for this transaction: a dropped table fails every call, the lease is
// checked (the clock read) the first time the transaction touches t. Commit checks it again
// (leasesLive, and for each table written), so every row it read or wrote was served while
// the lease was live: reading it once more per row only repeated that.
func (tx *Tx) serving(t *tableState) error {
	for _, l := range tx.leased {
		if l == t {
			if t.dropped.Load() {
				return t.serving()
			}
			return nil
		}
	}
	if err := t.serving(); err != nil {
		return err
	}
	tx.leased = append(tx.leased, t)
	return nil
}

// leasesLive checks again, with one clock read each, the lease of every table the
// transaction touched, written or only read: its reads are served under a live lease only if
// it still holds when they are validated.
func (tx *Tx) leasesLive() error {
	for _, t := range tx.leased {
		if t.superseded.Load() {
			// Replaced (txncoord.Supersede): whatever its lease says, a conflict, run
			// again through its successor.
			return fmt.Errorf("%w: table %q serves its partition no more: another table does (moved, healed or owned again)", ErrConflict, t.name)
		}
		if err := t.serving(); err != nil {
			return err
		}
	}
	return nil
}

// checkRowSize checks a row the caller gives to be written: any length but the row size (nil
// included) is ErrRowSize.
func checkRowSize(t *tableState, row []byte) error {
	if len(row) != t.rowBytes {
		return fmt.Errorf("%w: %d bytes, table %q has %d-byte rows", ErrRowSize, len(row), t.name, t.rowBytes)
	}
	return nil
}

// Get copies row id of table into dst (len(dst) must be the row size). It returns ErrNotFound
// when the row does not exist. It sees the transaction's own writes.
func (tx *Tx) Get(table *Table, id uint64, dst []byte) error {
	if tx.done {
		return ErrTxDone
	}
	t := table.t
	if len(dst) != t.rowBytes {
		return fmt.Errorf("%w: buffer of %d bytes, table %q has %d-byte rows", ErrRowSize, len(dst), t.name, t.rowBytes)
	}
	if i := tx.findWrite(t.id, id); i >= 0 {
		w := &tx.writes[i]
		if w.off < 0 {
			return ErrNotFound
		}
		copy(dst, tx.buf[w.off:int(w.off)+t.rowBytes])
		return nil
	}
	ok, err := tx.readRow(t, id, copyRow(dst))
	if err != nil {
		return err
	}
	if !ok {
		return ErrNotFound
	}
	return nil
}

// Put replaces row id of table with row. It returns ErrNotFound when the row does not exist.
func (tx *Tx) Put(table *Table, id uint64, row []byte) error {
	return tx.update(table.t, id, rowChange{put: row})
}

// Update calls fn with a copy of row id of table; what fn leaves in the slice is written at
// commit. If fn returns an error nothing is written and Update returns it. It returns
// ErrNotFound when the row does not exist.
func (tx *Tx) Update(table *Table, id uint64, fn func(row []byte) error) error {
	return tx.update(table.t, id, rowChange{update: fn, isUpdate: true})
}

// rowChange is the change of one row, without a closure for a Put: the caller's update when
// isUpdate, else a copy of put.
type rowChange struct {
	update   func(row []byte) error
	put      []byte
	isUpdate bool
}

// apply makes c in row.
func (c rowChange) apply(row []byte) error {
	if !c.isUpdate {
		copy(row, c.put)
		return nil
	}
	return c.update(row)
}

// update makes change c in row id of t.
func (tx *Tx) update(t *tableState, id uint64, c rowChange) error {
	if err := tx.checkWrite(t); err != nil {
		return err
	}
	if !c.isUpdate {
		if err := checkRowSize(t, c.put); err != nil {
			return err
		}
	}
	r := t.rowBytes
	if i := tx.findWrite(t.id, id); i >= 0 {
		w := &tx.writes[i]
		if w.off < 0 {
			return ErrNotFound
		}
		tx.scratch = append(tx.scratch[:0], tx.buf[w.off:int(w.off)+r]...)
		if err := c.apply(tx.scratch); err != nil {
			return err
		}
		copy(tx.buf[w.off:], tx.scratch)
		return nil
	}
	off := len(tx.buf)
	tx.buf = slices.Grow(tx.buf, r)[:off+r]
	row := tx.buf[off : off+r : off+r]
	ok, err := tx.readRow(t, id, copyRow(row))
	if err == nil && !ok {
		err = ErrNotFound
	}
	if err == nil {
		err = c.apply(row)
	}
	if err != nil {
		tx.buf = tx.buf[:off]
		return err
	}
	page, _ := logicpage.PageOf(id)
	m, _ := tx.pinPage(t, page, 0)
	tx.addWrite(writeRec{t: t, id: id, m: m, off: int32(off)})
	return nil
}

// Delete deletes row id of table. It returns ErrNotFound when the row does not exist.
func (tx *Tx) Delete(table *Table, id uint64) error {
	t := table.t
	if err := tx.checkWrite(t); err != nil {
		return err
	}
	if i := tx.findWrite(t.id, id); i >= 0 {
		w := &tx.writes[i]
		if w.off < 0 {
			return ErrNotFound
		}
		w.off = -1
		return nil
	}
	ok, err := tx.readRow(t, id, rowExists())
	if err != nil {
		return err
	}
	if !ok {
		return ErrNotFound
	}
	page, _ := logicpage.PageOf(id)
	m, _ := tx.pinPage(t, page, 0)
	tx.addWrite(writeRec{t: t, id: id, m: m, off: -1})
	return nil
}

// Insert adds row to table under a new id, which it returns. Ids come from whole pages granted
// to this node, so they are unique for ever; an insert that is rolled back leaves its id unused.
func (tx *Tx) Insert(table *Table, row []byte) (uint64, error) {
	t := table.t
	if err := tx.checkWrite(t); err != nil {
		return 0, err
	}
	if err := checkRowSize(t, row); err != nil {
		return 0, err
	}
	id, fresh, err := t.ids.take(tx.ctx, tx.db)
	if err != nil {
		return 0, err
	}
	page, _ := logicpage.PageOf(id)
	m, err := tx.pinPage(t, page, fresh)
	if err != nil {
		return 0, err
	}
	off := len(tx.buf)
	tx.buf = append(tx.buf, row...)
	tx.addWrite(writeRec{t: t, id: id, m: m, off: int32(off), insert: true})
	return id, nil
}

// Rollback abandons the transaction. Calling it after Commit is a no-op.
func (tx *Tx) Rollback() {
	if !tx.done {
		tx.release()
	}
}

// retryBusy ends tx, which stopped at a page it could not pin while holding others (see
// pinPage), and parks, with nothing pinned, until it holds the cache turn (*turn is then
// true; the retry loop gives it back when it ends): its next attempt may wait for frames
// while holding some, and the others yield to it. Retrying at once instead thrashed: in a
// tiny cache the transactions took each other's pages for ever. It returns nil when the
// transaction should run again; ErrCacheFull when the retry loop has been busy for longer
// than Options.CacheWait since *since (set at its first call); ctx's error if it ends first.
func (tx *Tx) retryBusy(since *time.Time, turn *bool) error {
	db, ctx := tx.db, tx.ctx
	tx.Rollback()
	if since.IsZero() {
		*since = time.Now()
	} else if d := time.Since(*since); d > db.opts.CacheWait {
		return fmt.Errorf("%w (for %v)", errCacheBusy, d.Round(time.Millisecond))
	}
	db.stats.retries.Add(1)
	if *turn {
		return nil
	}
	if err := db.cache.takeTurn(ctx, since.Add(db.opts.CacheWait)); err != nil {
		return err
	}
	*turn = true
	return nil
}

var zeroWords [512]uint64

func zeroRow(dst []byte) {
	for len(dst) > 0 {
		n := min(len(dst), len(zeroWords)*8)
		logicpage.StoreRow(dst[:n], wordsAsBytes(zeroWords[:n/8]))
		dst = dst[n:]
	}
}

func wordsAsBytes(w []uint64) []byte {
	if len(w) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), len(w)*8)
}

// Context returns the context the transaction was begun with (DB.Update's, View's, Begin's,
// Session.Go's): code that runs inside a Tx, such as a composite structure's waits, honours
// it. After the transaction ends it returns context.Background(). Called by the goroutine
// running the Tx.
func (tx *Tx) Context() context.Context {
	if tx.ctx == nil {
		return context.Background()
	}
	return tx.ctx
}
