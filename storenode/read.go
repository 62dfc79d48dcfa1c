package storenode

import (
	"fmt"
	"math/bits"
	"sync"
	"time"

	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/logicpage"
)

// Reads. The bitmap-tree says which rows exist; the cache frame holds their bytes when it has
// them; otherwise the page's durable copy is read from its data file (outside mu, with the
// frame marked loading so nobody evicts it or loads it twice), checked against the checksum in
// its page-map entry, and merged into the frame: only slots that are still not valid take the
// disk bytes, so rows committed meanwhile are never overwritten by older ones.

var diskPagePool sync.Pool // *[]byte of varying sizes

func getDiskPage(n int) *[]byte {
	if p, ok := diskPagePool.Get().(*[]byte); ok && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	b := logicpage.AlignedBytes(n)
	return &b
}

// ReadRows answers a sparse read of one page for the table's owner: data is want's present
// rows, clear want's absent ones, and the rows of data are appended to dst in slot order. It
// returns the extended dst. The owner sees its own writes before they are durable; every other
// reader must use ReadRowsAs.
func (e *Engine) ReadRows(tableID uint32, page, want uint64, dst []byte) (data, clear uint64, out []byte, err error) {
	return e.readRows(0, true, tableID, page, want, dst)
}

// ReadRowsAs is ReadRows on behalf of reader (an owner id; 0 for a session without one): a
// reader that is not the table's holder (its owner id, and the incarnation that was granted
// the table: holderReads) is served only durable rows: it waits until every
// write to the page (the frame's LSN) is durable, which after a WAL failure ends with the
// failure. Its wait is bounded: under writes to the same page that never pause, it waits for
// at most readUnlockedWaits+1 WAL syncs, the last one holding back commits (waitReadDurable).
func (e *Engine) ReadRowsAs(reader uint64, tableID uint32, page, want uint64, dst []byte) (data, clear uint64, out []byte, err error) {
	return e.readRows(reader, false, tableID, page, want, dst)
}

func (e *Engine) readRows(reader uint64, trusted bool, tableID uint32, page, want uint64, dst []byte) (data, clear uint64, out []byte, err error) {
	if page >= tablePagesMax {
		return 0, 0, dst, fmt.Errorf("%w: page %d beyond a table's last page %d", ErrMalformed, page, tablePagesMax-1)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	waits := 0
	for {
		if err := e.usable(); err != nil {
			return 0, 0, dst, err
		}
		t, err := e.table(tableID)
		if err != nil {
			return 0, 0, dst, err
		}
		if e.moves != nil && !trusted {
			if err := e.moveRefusesRead(t, false); err != nil {
				return 0, 0, dst, err
			}
		}
		key := frameKey(t.id, page)
		if err := e.holderReadLocked(t, reader, trusted, page, want); err != nil {
			return 0, 0, dst, err
		}
		id, cached := e.cache.lookup(key)
		// A page without a frame has no write that is not durable (a dirty frame stays
		// until a checkpoint, which syncs the WAL first).
		if cached && !trusted {
			if lsn := e.cache.frames[id].lsn; lsn > e.durableThrough() && !e.holderReads(t, reader) {
				if err := e.waitReadDurable(lsn, &waits); err != nil {
					return 0, 0, dst, err
				}
				continue
			}
		}
		present := t.presentWord(page)
		data, clear = want&present, want&^present
		if data == 0 {
			return data, clear, dst, nil
		}
		if cached {
			f := &e.cache.frames[id]
			if f.loading {
				e.cond.Wait()
				continue
			}
			if f.valid&data == data {
				f.ref = true
				e.cache.hits++
				return data, clear, gatherRows(dst, e.cache.rows(id), t.geo, data), nil
			}
		}
		e.cache.misses++
		if !cached {
			var ok bool
			if id, ok = e.cache.alloc(key, t.geo.PageBytes(), false); !ok {
				// Nothing evictable: answer from the disk copy without caching it.
				buf, err := e.readDiskPage(t, page)
				if err != nil {
					return 0, 0, dst, err
				}
				dst = gatherRows(dst, (*buf)[:t.geo.PageBytes()], t.geo, data)
				diskPagePool.Put(buf)
				return data, clear, dst, nil
			}
		}
		if err := e.loadFrame(t, page, id); err != nil {
			return 0, 0, dst, err
		}
	}
}

// loadFrame merges the page's durable copy into frame id: every slot not yet valid takes the
// disk bytes. Caller holds mu; it is released during the read and held again on return.
// On return the frame is full (valid = all slots) or err says why not.
func (e *Engine) loadFrame(t *table, page uint64, id int32) error {
	key := e.cache.frames[id].key
	e.cache.frames[id].loading = true
	buf, err := e.readDiskPage(t, page)
	f := &e.cache.frames[id] // frames may have grown while mu was released
	if f.key != key || t.dropped {
		// DropTable removed the frame while it loaded (and it may have been reused).
		if buf != nil {
			diskPagePool.Put(buf)
		}
		return fmt.Errorf("%w: %q was dropped", ErrTableNotFound, t.name)
	}
	f.loading = false
	e.cond.Broadcast()
	if err != nil {
		if !f.dirty && f.valid == 0 {
			e.cache.drop(id)
		}
		return err
	}
	rows := e.cache.rows(id)
	r := t.geo.RowBytes()
	for m := ^f.valid; m != 0; m &= m - 1 {
		s := bits.TrailingZeros64(m)
		copy(rows[s*r:(s+1)*r], (*buf)[s*r:(s+1)*r])
	}
	f.valid = ^uint64(0)
	diskPagePool.Put(buf)
	return nil
}

// readDiskPage reads and checks the durable copy of a page. A page without one reads as zeros.
// Caller holds mu; it is released during the read and held again on return.
func (e *Engine) readDiskPage(t *table, page uint64) (*[]byte, error) {
	size := t.geo.DiskPageBytes()
	buf := getDiskPage(size)
	e.mu.Unlock()
	t.io.RLock()
	ent := t.entry(page)
	var err error
	if ent.disk != 0 {
		start := time.Now()
		_, err = t.data.ReadAt(*buf, int64(ent.disk-1)*int64(size))
		e.lat.readMiss.Since(start)
	} else {
		clear(*buf)
	}
	t.io.RUnlock()
	e.mu.Lock()
	if err != nil {
		diskPagePool.Put(buf)
		return nil, fmt.Errorf("storenode: table %q: read page %d from disk page %d: %w", t.name, page, ent.disk-1, err)
	}
	if ent.disk != 0 {
		e.stats.diskReads.Add(1)
		if got := checksum.Of(*buf); got != ent.crc {
			diskPagePool.Put(buf)
			return nil, corruptTable(t, "page %d: disk page %d of %s has checksum %#08x, page map says %#08x",
				page, ent.disk-1, dataFileName(e.dir, t.id), got, ent.crc)
		}
	}
	return buf, nil
}

// holderReadLocked refuses t's holder a read of rows a prepared transaction holds
// (ErrTxnLocked: read again once it is decided). The holder caches what it reads and writes
// those rows back as its own: a row it cached before the decision is applied here would undo
// a commit applied after (a holder whose cache lost its locks: a new transaction node of the
// same owner and grant, or one that gave up waiting for its Apply). Other readers get the last
// committed version: they never write it back; so do trusted reads (an embedded store's
// transaction node, in this process, or an offline tool). Caller holds mu; without prepared
// transactions it costs one map length.
func (e *Engine) holderReadLocked(t *table, reader uint64, trusted bool, page, want uint64) error {
	if len(e.txnLocks) == 0 || trusted || !t.heldBy(reader) {
		return nil
	}
	if m := e.txnLocks[frameKey(t.id, page)] & want; m != 0 {
		return fmt.Errorf("%w: the holder's read of table %d page %d rows %#016x: a prepared transaction holds them", ErrTxnLocked, t.id, page, m)
	}
	return nil
}

// heldBy reports whether owner (nonzero) is t's holder. Caller holds mu.
func (t *table) heldBy(owner uint64) bool { return owner != 0 && t.holder == owner }

// readUnlockedWaits is how many times a read that is not its table's holder's waits for
// durability with mu released before it waits with mu held (waitReadDurable).
const readUnlockedWaits = 2

// waitReadDurable is a non-holder read's wait until lsn (its page's or table's last write) is
// durable; *waits counts the read's waits. The first readUnlockedWaits waits release mu, so
// commits go on; but the owner may write the page again before every fsync returns, and the
// read would wait for ever. Later waits keep mu: no commit can write the page meanwhile, so
// the read is answered after at most one more WAL sync, and commits (and every other engine
// call) pause for that sync. The WAL's goroutine never takes mu, so holding it cannot
// deadlock. Caller holds mu; it is held again on return.
func (e *Engine) waitReadDurable(lsn uint64, waits *int) error {
	*waits++
	if *waits <= readUnlockedWaits {
		return e.waitDurableUnlocked(lsn)
	}
	e.readBarriers.Add(1)
	return e.waitDurable(lsn)
}

// waitDurableUnlocked waits, with mu released, until lsn is durable. Caller holds mu; it is
// held again on return.
func (e *Engine) waitDurableUnlocked(lsn uint64) error {
	e.mu.Unlock()
	err := e.waitDurable(lsn)
	e.mu.Lock()
	return err
}

func gatherRows(dst, rows []byte, g logicpage.Geometry, mask uint64) []byte {
	r := g.RowBytes()
	for m := mask; m != 0; m &= m - 1 {
		s := bits.TrailingZeros64(m)
		dst = append(dst, rows[s*r:(s+1)*r]...)
	}
	return dst
}

// pageDirEntriesMax bounds the entries of one page directory answer, the engine's (PageDir)
// and the server's PageDir reply alike.
const pageDirEntriesMax = 1 << 16

// PageDir lists the pages of [lo, hi) that hold rows, with their present masks, at most max of
// them, in page order. next is where to continue: hi when the range is done.
func (e *Engine) PageDir(tableID uint32, lo, hi uint64, max int, dst []PageInfo) (out []PageInfo, next uint64, err error) {
	return e.pageDir(0, true, tableID, lo, hi, max, dst)
}

// PageDirAs is PageDir on behalf of reader (see ReadRowsAs): a reader that is not the table's
// holder waits until the table's writes are durable (its last write's LSN), so it never lists
// a row, or misses one, that a crash could take back. Under writes to the table that never
// pause it waits for at most readUnlockedWaits+1 WAL syncs, as ReadRowsAs.
func (e *Engine) PageDirAs(reader uint64, tableID uint32, lo, hi uint64, max int, dst []PageInfo) (out []PageInfo, next uint64, err error) {
	return e.pageDir(reader, false, tableID, lo, hi, max, dst)
}

func (e *Engine) pageDir(reader uint64, trusted bool, tableID uint32, lo, hi uint64, max int, dst []PageInfo) (out []PageInfo, next uint64, err error) {
	hi = min(hi, tablePagesMax)
	if lo >= hi {
		return dst, hi, nil // also keeps lo*RowsPerPage from wrapping for lo near 2^58
	}
	if max <= 0 || max > pageDirEntriesMax {
		max = pageDirEntriesMax
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var t *table
	waits := 0
	for {
		if err := e.usable(); err != nil {
			return dst, 0, err
		}
		if t, err = e.table(tableID); err != nil {
			return dst, 0, err
		}
		if e.moves != nil && !trusted {
			if err := e.moveRefusesRead(t, true); err != nil {
				return dst, 0, err
			}
		}
		if trusted || t.writeLSN <= e.durableThrough() || e.holderReads(t, reader) {
			break
		}
		if err := e.waitReadDurable(t.writeLSN, &waits); err != nil {
			return dst, 0, err
		}
	}
	n := 0
	for first, present := range t.rows.Words(lo*logicpage.RowsPerPage, hi*logicpage.RowsPerPage) {
		page := first / logicpage.RowsPerPage
		dst = append(dst, PageInfo{Page: page, Present: present})
		if n++; n == max {
			return dst, page + 1, nil
		}
	}
	return dst, hi, nil
}
