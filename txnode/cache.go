package txnode

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/logicpage"
)

// The logical page cache: 64-row page frames under a hard byte budget.
//
// Each frame owns one []uint64 allocation: 64 row version words, then the page's rows. Its
// metadata (key, masks, page version, pins) are atomics in a frameMeta, in chunks that never
// move, so lock-free readers can hold a frame id while frames are added; beside each chunk's
// metadata is its frames' flight record (frameFlight: which rows are in commit batches not yet
// settled, off the hit path's cache line).
// The Go pointers per frame are its memory's and, while it is in the page table, its slot's
// two (metadata and memory, so a hit's row loads do not wait for the metadata); the rows
// themselves are pointer-free, so the garbage collector scans three words per page.
//
// Invariants:
//   - usedBytes <= budgetBytes, always. usedBytes counts every byte the cache allocates
//     that scales with it: frames' memory (frameCost: rows, versions, the slice header),
//     the metadata chunks made so far (metaChunk frameMetas each), the page table's arrays
//     and the fixed part (the chunk directory, sized from the budget, and the row-wait
//     shards). Not counted: the pageCache struct itself and its slices of free and zombie
//     frame ids (4 bytes per frame id).
//   - A frame with pins > 0 (a running transaction, a pin set, a fetch, the flusher's copy)
//     or dirty != 0 (WriteBack rows not yet cut into an epoch) is never evicted. Only a pinned
//     frame becomes dirty or in flight (the flusher pins a frame before it clears its dirty
//     bits), so the evictor checks again after it cleared the key: a pin that got in before
//     then has committed and unpinned by the time it looks.
//   - A frame with rows in flight (in a commit batch not yet settled: acknowledged, or failed
//     and retired) may be evicted: the batch owns a copy of its rows (pipeline.go) and never
//     reads or writes the frame's memory after the copy. But the store answers reads ahead of
//     queued commits, so the store may still hold older images of those rows: the evictor
//     leaves a ghost (pageCache.ghosts: the page's highest version in flight and the slots of
//     those rows), the page's next frame inherits it (frameFlight.ghostVer, ghostMask), and a
//     fetch of any of those slots first waits until every batch up to ghostVer has settled
//     (pipeline.waitSettled), so its read is sent after the acknowledgement and the store
//     answers with the batch's rows applied. A fill then takes the durable version, which is
//     at least the version in flight was. A frame's flight record (ver, mask) covers every
//     row a batch not yet settled holds; mask is reset only once all of them settled.
//     Eviction never changes what a running transaction read: its frames are pinned.
//   - A new frame's valid slots are only those known to hold no row anywhere: a page of newly
//     granted ids may already hold rows that reached the store and whose frame was evicted.
//   - A transaction that holds pinned frames waits for another only within a cap (see pin),
//     or when it holds the cache turn (pageCache.turn): one transaction at a time, chosen
//     among those sent back with errCacheBusy. While the turn holder waits, no other caller
//     takes a new frame and waiters holding frames give theirs up (errCacheBusy), so waiting
//     transactions cannot pin the whole cache between them, and the turn holder progresses.
//   - A frame's key is set before it is published in the page table and cleared before it is
//     removed, so a lock-free reader that finds a frame id checks the frame's key afterwards.
//     Every change of key bumps the frame's generation (frameMeta.state, after the key's
//     store): a lock-free reader loads it, then checks the key, and after its copy checks
//     that the generation is unchanged (the key alone misses a frame that went to another
//     page and came back meanwhile).
//   - A slot's bytes are meaningful only while its valid bit is set; a fill writes only slots
//     still invalid (a commit that landed while the miss was in flight is never overwritten).
//   - Row version words: bit 63 is the row's lock; the rest is the version, taken from the
//     node's monotonic commit counter and never reset (a fill uses the durable version, which
//     only grows).

const (
	versionLock  = uint64(1) << 63
	metaChunk    = 64      // frameMetas per chunk: 4 KiB, so a tiny cache does not pay for 1024
	frameMetaCap = 1 << 22 // frames at most: 4M pages (16 GiB of 64-byte rows)
)

type frameMeta struct {
	key      atomic.Uint64 // table<<32 | page; 0 when free
	present  atomic.Uint64
	valid    atomic.Uint64
	dirty    atomic.Uint64 // WriteBack: rows changed and not yet flushed
	pageVer  atomic.Uint64 // commit version of the last change to present
	pins     atomic.Int32
	frameIdx int32 // its frame id (c.meta(frameIdx) is this), set with its chunk: to its flight record
	// state: bit 0 is CLOCK's reference bit; bits 1-31 the key's generation, bumped by
	// every change of key (setKey). A lock-free reader loads it before it reads a slot and
	// checks it after: an unchanged generation means the frame held the same page all the
	// while. The key alone could not say that: a frame evicted, filled for another page and
	// evicted again back to its page between a reader's two version loads would show the
	// same key and, after fills at the same durable version, the same version word, while
	// the reader copied the other page's row.
	state    atomic.Uint32
	rowBytes int32 // set under mu while free
	// mem is the frame's memory (frameMemWords(rowBytes) words; see wordsOf): a pointer to
	// its first word, so a hit goes from the metadata to the row without a slice header.
	mem atomic.Pointer[uint64]
}

func pageKey(table uint32, page uint64) uint64 { return uint64(table)<<32 | page }

const refBit = 1

// setKey gives the frame another key (0: none), then bumps its generation: a reader that
// loaded the generation before the bump sees it changed once it has seen anything written
// after (the slots cleared or filled for the new key), and one that loaded it after the
// bump sees the new key. Caller holds the cache's mu.
func (m *frameMeta) setKey(key uint64) {
	m.key.Store(key)
	m.state.Add(2)
}

// touch sets CLOCK's reference bit, writing the line only if it is clear: cores reading
// one page share its metadata line.
func (m *frameMeta) touch() {
	if m.state.Load()&refBit == 0 {
		m.state.Or(refBit)
	}
}

// clean reports whether the frame may be evicted as far as its rows go: none dirty (rows in
// flight leave a ghost instead, see ghostLocked).
func (m *frameMeta) clean() bool { return m.dirty.Load() == 0 }

// metaBlock is one chunk of frame metadata and, apart so that a hit does not touch them,
// the chunk's flight records.
type metaBlock struct {
	metas   [metaChunk]frameMeta
	flights [metaChunk]frameFlight
}

type pageCache struct {
	budgetBytes int64
	waitMax     time.Duration
	pt          *pageTable
	chunks      []atomic.Pointer[metaBlock]

	mu        sync.Mutex
	roomMade  *sync.Cond
	usedBytes int64
	nFrames   int32   // frame ids handed out so far
	free      []int32 // frame ids without memory
	hand      int32
	waiters   atomic.Int32
	// waitersHeldBytes is what the frames pinned by goroutines waiting for another frame
	// cost (frameCost of each, by its own row size), waitersHeld how many they are; capped,
	// see pin.
	waitersHeldBytes int64
	waitersHeld      int64
	zombies          []int32 // unpublished frames of dropped tables, freed when unpinned
	// rows parks goroutines waiting for a locked row (rowwait.go).
	rows rowWaits
	// needFlush is called (without mu) when dirty WriteBack frames block eviction.
	needFlush func()
	// freshNow reports the slots of a page (by key) whose ids are not handed out yet, at
	// the time it is called (idAllocator.freshOf). Called under mu when pin creates a frame
	// with a fresh mask; it must not take the cache's mutex or wait.
	freshNow func(key uint64) uint64

	// turn is the cache turn: held (one token) by the transaction that may wait for frames
	// while holding others, without the cap (Tx.retryBusy takes it). turnWaiting: its holder
	// waits for a frame now; others then take no new frame and give up held ones.
	turn        chan struct{}
	turnWaiting atomic.Bool

	// settledVer: every commit batch holding a version <= it has settled (acknowledged, or
	// failed and retired): the store has applied it, or never will. The pipeline advances it,
	// in seq order.
	settledVer atomic.Uint64
	// ghosts are the pages evicted with rows in flight and not cached since (under mu). At
	// most one per page; swept of settled ones when they double past ghostsSwept (so at most
	// about twice the pages with rows in flight, which the in-flight byte bound bounds).
	ghosts      map[uint64]ghost
	ghostsSwept int

	hits, misses, evictions, ghostsMade atomic.Uint64

	tp tablePins // table pins (Table.Pin, pin.go), under mu
}

func newPageCache(budgetBytes int64, waitMax time.Duration) *pageCache {
	// Enough chunk pointers for as many frames as the budget could hold of the smallest row.
	maxFrames := min(budgetBytes/frameCost(8)+1, frameMetaCap)
	c := &pageCache{budgetBytes: budgetBytes, waitMax: waitMax, pt: newPageTable(),
		chunks: make([]atomic.Pointer[metaBlock], (maxFrames+metaChunk-1)/metaChunk),
		turn:   make(chan struct{}, 1), ghosts: make(map[uint64]ghost, ghostsMin)}
	c.roomMade = sync.NewCond(&c.mu)
	c.usedBytes = c.fixedBytes() + c.pt.bytes()
	return c
}

// fixedBytes is the cache's memory that does not grow: the chunk directory and the row-wait
// shards.
func (c *pageCache) fixedBytes() int64 {
	return int64(len(c.chunks))*int64(unsafe.Sizeof(c.chunks[0])) + int64(unsafe.Sizeof(rowWaits{}))
}

// chunkBytes is one metadata chunk (with its flight records).
const chunkBytes = int64(unsafe.Sizeof(metaBlock{}))

// frameCost is what one frame of this row size costs against the budget: its memory (rows
// and version words, rounded up to the allocator's size class, as the heap holds it) and the
// slice header its pointer holds. (Its frameMeta is counted with its chunk, its page table
// slots with the table.)
func frameCost(rowBytes int) int64 {
	return int64(frameMemWords(rowBytes))*8 + int64(unsafe.Sizeof([]uint64(nil)))
}

// frameMemWordsBy caches frameMemWords per row size (rowBytes/8; row sizes are multiples of 8
// up to 4096).
var frameMemWordsBy [4096/8 + 1]atomic.Int32

// frameMemWords is the length of a frame's memory: 64 version words and the rows, up to the
// capacity the allocator gives such a slice anyway (its size class).
func frameMemWords(rowBytes int) int {
	if n := frameMemWordsBy[rowBytes/8].Load(); n != 0 {
		return int(n)
	}
	n := logicpage.RowsPerPage + logicpage.RowsPerPage*rowBytes/8
	n = cap(append([]uint64(nil), make([]uint64, n)...)) // append rounds up to the size class
	frameMemWordsBy[rowBytes/8].Store(int32(n))
	return n
}

// framesMax is how many frames of this row size the budget holds at most (with their chunks
// and page table): a working set of more pages can never be pinned at once.
func (c *pageCache) framesMax(rowBytes int) int {
	cost := frameCost(rowBytes)
	lo, hi := int64(0), min(c.budgetBytes/cost+1, int64(len(c.chunks)*metaChunk)) // canHold(lo) holds
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if c.canHold(mid, mid*cost) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return int(lo)
}

// canHold reports whether the budget holds n frames whose memory (frameCost) totals
// frameBytes, with their metadata chunks and page table: whether such a working set, of any
// mix of row sizes, can ever be pinned at once.
func (c *pageCache) canHold(n, frameBytes int64) bool {
	if n > int64(len(c.chunks)*metaChunk) {
		return false
	}
	slots := int64(16)
	for n*4 > slots*3 {
		slots *= 2
	}
	return c.fixedBytes()+(n+metaChunk-1)/metaChunk*chunkBytes+frameBytes+slots*ptSlotBytes <= c.budgetBytes
}

func (c *pageCache) meta(id int32) *frameMeta {
	return &c.chunks[id/metaChunk].Load().metas[id%metaChunk]
}

// frameWords returns the 64 version words and the rows (as bytes) of a frame that holds
// memory (pinned) for rowBytes-byte rows (its table's).
func frameWords(m *frameMeta, rowBytes int) (versions []uint64, rows []byte) {
	return wordsOf(m.mem.Load(), rowBytes)
}

// frameVersions returns the 64 version words of a frame that holds memory.
func frameVersions(m *frameMeta) []uint64 { return versionsOf(m.mem.Load()) }

// versionsOf returns the version words of a frame's memory (every frame's memory starts with
// them, whatever its row size).
func versionsOf(mem *uint64) []uint64 { return unsafe.Slice(mem, logicpage.RowsPerPage) }

// wordsOf splits a frame's memory, which must be for rowBytes-byte rows: its versions, then
// the page's rows (the words past them, up to the allocator's size class, are never used).
// Lock-free readers load m.mem themselves, check it for nil (a frame evicted to make room
// for another row size) and check the frame's key after loading it and before calling
// wordsOf: memory is given another row size only while its frame holds no key, and a key
// names a table, so a key that matches before and after the load vouches for the size.
func wordsOf(mem *uint64, rowBytes int) (versions []uint64, rows []byte) {
	r := unsafe.Add(unsafe.Pointer(mem), logicpage.RowsPerPage*8)
	return versionsOf(mem), unsafe.Slice((*byte)(r), logicpage.RowsPerPage*rowBytes)
}

// lookup finds the frame of key without a lock; -1 when absent.
func (c *pageCache) lookup(key uint64) (int32, *frameMeta) {
	id := c.pt.lookup(key)
	if id < 0 {
		return -1, nil
	}
	m := c.meta(id)
	if m.key.Load() != key {
		return -1, nil
	}
	return id, m
}

// pin returns the frame of key pinned (never evicted until unpin), creating one if absent:
// present 0 and valid = fresh, the slots known to hold no row anywhere (ids of this node's
// grant not yet handed out), 0 for any other page. When no frame can be had it waits up to
// waitMax for room and then fails with ErrCacheFull.
//
// held is how many frames the caller holds pinned already (of this row size: pinAs takes
// held frames of any sizes). Waiting while holding frames can
// deadlock: goroutines that each hold frames and wait for one more can pin the whole cache
// between them. So the frames held by waiters are capped below the budget, by an eighth of
// it and at least one frame; a caller that would pass the cap fails at once with
// errCacheBusy, to release its frames and wait with none (Tx.retryBusy). Then some frames
// are always held by goroutines that are not waiting for the cache, or dirty,
// and those become free. (The cap is high because every transaction sent back to wait with
// nothing loses the pages it had, which others then evict: a thrash.)
func (c *pageCache) pin(ctx context.Context, key uint64, rowBytes int, fresh uint64, held int) (int32, *frameMeta, error) {
	return c.pinAs(ctx, key, rowBytes, fresh, held, int64(held)*frameCost(rowBytes), false)
}

// pinAs is pin for a caller that holds held frames costing heldBytes (frameCost each: a
// transaction's pages may be of tables of different row sizes); turn says the caller holds
// the cache turn: with frames held it waits without the cap (up to waitMax), and while it
// waits the others yield to it.
func (c *pageCache) pinAs(ctx context.Context, key uint64, rowBytes int, fresh uint64, held int, heldBytes int64, turn bool) (int32, *frameMeta, error) {
	if id, m := c.lookup(key); m != nil {
		m.pins.Add(1)
		if m.key.Load() == key {
			m.touch()
			return id, m, nil
		}
		m.pins.Add(-1) // evicted between lookup and pin; go the slow way
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// Counted as a waiter before looking for a frame: an unpin or an acknowledgement checks
	// the count without mu after it made a frame evictable, so either it sees us (and wakes
	// us once we wait) or we see the frame. Counting only just before Wait lost that wake-up
	// (with a long CacheWait, a wait of the whole CacheWait).
	c.waiters.Add(1)
	defer c.waiters.Add(-1)
	var deadline time.Time
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	if turn {
		defer func() { // under mu (deferred after the Unlock, so it runs before)
			if c.turnWaiting.Load() {
				c.turnWaiting.Store(false)
				c.roomMade.Broadcast() // those who yielded to the turn may take frames again
			}
		}()
	}
	for {
		if id := c.pt.lookup(key); id >= 0 {
			m := c.meta(id)
			assert.That(m.key.Load() == key, "txnode: page table and frame disagree")
			m.pins.Add(1)
			m.touch()
			return id, m, nil
		}
		// While the turn holder waits for a frame, nobody else takes one: frames that free
		// up go to it, and a waiter holding frames gives them up.
		yield := !turn && c.turnWaiting.Load()
		if yield && held > 0 {
			return -1, nil, errCacheBusy
		}
		id, ok := int32(-1), false
		if !yield {
			id, ok = c.allocLocked(rowBytes)
		}
		if ok {
			m := c.meta(id)
			if fresh != 0 && c.freshNow != nil {
				// fresh was computed when the id was taken; this pin may have waited since,
				// and ids taken meanwhile may hold committed rows the store has.
				fresh &= c.freshNow(key)
			}
			m.present.Store(0)
			m.valid.Store(fresh)
			m.dirty.Store(0)
			m.pageVer.Store(0)
			// Add, not Store: a pin that found this frame under its old key may still be
			// backing off (Add(1), key check, Add(-1)); a Store would lose our pin to its -1.
			m.pins.Add(1)
			c.takeGhostLocked(key, c.flight(m))
			m.state.Or(refBit)
			m.setKey(key)
			ptBefore := c.pt.bytes()
			c.pt.insert(key, id, m, m.mem.Load())
			c.usedBytes += c.pt.bytes() - ptBefore // allocLocked made room for it
			// - usedBytes <= budgetBytes, always.
			assert.That(c.usedBytes <= c.budgetBytes, "txnode: page cache over its budget after a page table insert")
			if len(c.tp.byTable) != 0 {
				c.stickNewLocked(key, m) // a pinned table's new page (pin.go)
			}
			return id, m, nil
		}
		if held > 0 && !c.canHold(int64(held)+1, heldBytes+frameCost(rowBytes)) {
			// The held pages and this one are more than the cache can ever hold at once
			// (counted by their own row sizes): waiting cannot help.
			return -1, nil, fmt.Errorf("%w: %d pages (%d bytes of frames) and one of %d-byte rows in %d bytes",
				errWorkingSet, held, heldBytes, rowBytes, c.budgetBytes)
		}
		// Nothing evictable: wait for an unpin or a flush, a bounded time.
		if turn && !c.turnWaiting.Load() {
			c.turnWaiting.Store(true)
			c.roomMade.Broadcast() // waiters holding frames give them up
		}
		if held > 0 && !turn && deadline.IsZero() {
			// Waiters may hold frames only while one more frame, besides theirs, still fits
			// in the budget with everything it costs (metadata chunks, page table): else
			// they could hold every frame the cache can make between them and wait for
			// each other (the 1/8 margin alone is eaten by that overhead in a tiny cache).
			// Frames held by table pins (pin.go) are never freed for them either.
			if c.waitersHeldBytes+heldBytes > c.budgetBytes-c.tp.bytes-max(c.budgetBytes/8, frameCost(rowBytes)) ||
				!c.canHold(c.waitersHeld+int64(held)+1, c.waitersHeldBytes+heldBytes+frameCost(rowBytes)) {
				if c.needFlush != nil {
					go c.needFlush()
				}
				return -1, nil, errCacheBusy
			}
			c.waitersHeldBytes += heldBytes
			c.waitersHeld += int64(held)
			defer func() { // under mu: the deferred Unlock runs after
				c.waitersHeldBytes -= heldBytes
				c.waitersHeld -= int64(held)
			}()
		}
		if err := ctx.Err(); err != nil {
			return -1, nil, err
		}
		if deadline.IsZero() {
			// Woken by room made, by the CacheWait timer and by the end of ctx: every wait
			// honours its context (a 50 ms deadline must not wait a whole CacheWait).
			deadline = time.Now().Add(c.waitMax)
			wake := func() {
				c.mu.Lock()
				c.roomMade.Broadcast()
				c.mu.Unlock()
			}
			timer = time.AfterFunc(c.waitMax, wake)
			stopCtx := context.AfterFunc(ctx, wake)
			defer stopCtx()
		}
		if !time.Now().Before(deadline) {
			return -1, nil, fmt.Errorf("%w: %d bytes of %d in frames that are pinned or dirty",
				ErrCacheFull, c.usedBytes, c.budgetBytes)
		}
		if c.needFlush != nil {
			go c.needFlush()
		}
		c.roomMade.Wait()
	}
}

// unpin releases a pin taken by pin.
func (c *pageCache) unpin(m *frameMeta) {
	if m.pins.Add(-1) == 0 && c.waiters.Load() > 0 {
		// One frame, one waiter: waking them all would have them queue on mu for it. But
		// when the turn holder waits, it must be the one to get it.
		c.mu.Lock()
		if c.turnWaiting.Load() {
			c.roomMade.Broadcast()
		} else {
			c.roomMade.Signal()
		}
		c.mu.Unlock()
	}
}

// signalRoom wakes every goroutine waiting for a frame (acknowledged batches free many).
// Cheap when nobody waits.
func (c *pageCache) signalRoom() {
	if c.waiters.Load() > 0 {
		c.mu.Lock()
		c.roomMade.Broadcast()
		c.mu.Unlock()
	}
}

// allocLocked returns a free frame with memory for rowBytes, evicting as needed. Caller
// holds mu. The frame's key is 0 and it is not in the page table.
func (c *pageCache) allocLocked(rowBytes int) (int32, bool) {
	cost := frameCost(rowBytes)
	c.reapZombiesLocked()
	for {
		// What a new frame adds: its memory, a new chunk if it needs a new frame id, and
		// the page table's growth if its insert grows it.
		need := cost + c.pt.growBytes()
		if len(c.free) == 0 && c.nFrames%metaChunk == 0 {
			need += chunkBytes
		}
		if c.usedBytes+need <= c.budgetBytes {
			break
		}
		victim, ok := c.evictLocked()
		if !ok {
			return -1, false
		}
		vm := c.meta(victim)
		if int(vm.rowBytes) == rowBytes {
			return victim, true // reuse its memory as it is
		}
		vm.mem.Store(nil)
		c.usedBytes -= frameCost(int(vm.rowBytes))
		c.free = append(c.free, victim)
	}
	var id int32
	if n := len(c.free); n > 0 {
		id = c.free[n-1]
		c.free = c.free[:n-1]
	} else {
		if int(c.nFrames) >= len(c.chunks)*metaChunk {
			return -1, false
		}
		id = c.nFrames
		c.nFrames++
		if id%metaChunk == 0 {
			blk := new(metaBlock)
			for i := range blk.metas {
				blk.metas[i].frameIdx = id + int32(i)
			}
			c.chunks[id/metaChunk].Store(blk)
			c.usedBytes += chunkBytes
		}
	}
	m := c.meta(id)
	m.rowBytes = int32(rowBytes)
	mem := make([]uint64, frameMemWords(rowBytes))
	m.mem.Store(&mem[0])
	c.usedBytes += cost
	// - usedBytes <= budgetBytes, always: room was made for the frame, its chunk and the
	//   page table's growth.
	assert.That(c.usedBytes+c.pt.growBytes() <= c.budgetBytes, "txnode: page cache over its budget after an allocation")
	return id, true
}

// evictLocked unpublishes one evictable frame by CLOCK and returns its id (memory kept).
func (c *pageCache) evictLocked() (int32, bool) {
	n := c.nFrames
	if n == 0 {
		return -1, false // no frame yet (a budget too small for one): chunk 0 does not exist
	}
	for range 2*n + 1 {
		if c.hand >= n {
			c.hand = 0
		}
		id := c.hand
		c.hand++
		m := c.meta(id)
		key := m.key.Load()
		// Dirty before pins: the flusher pins a dirty frame (without a key check) before it
		// clears its dirty bits, so a frame seen clean here after that shows the pin. Pins
		// first let the flusher's pin and clear both fall between the two loads: the frame
		// looked evictable, its key was cleared under the flusher, which read key 0 and
		// dropped the rows it had just taken from dirty (never sent: a lost WriteBack commit).
		if key == 0 || !m.clean() || m.pins.Load() > 0 {
			continue
		}
		if m.state.Load()&refBit != 0 {
			m.state.And(^uint32(refBit))
			continue
		}
		m.setKey(0)
		// A pin that raced with us re-checks the key and backs off. One that got in before
		// may have committed to the frame (dirty, in flight) and unpinned since the check
		// above: look again, and undo.
		if m.pins.Load() > 0 || !m.clean() {
			m.setKey(key)
			continue
		}
		if g, ok := c.ghostLocked(m); ok {
			c.addGhostLocked(key, g)
		}
		c.pt.remove(key)
		m.valid.Store(0)
		m.present.Store(0)
		c.evictions.Add(1)
		return id, true
	}
	return -1, false
}

// dropTable removes every frame of a dropped table. Frames still pinned are only unpublished.
func (c *pageCache) dropTable(table uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unpinTableLocked(table)
	for id := range c.nFrames {
		m := c.meta(id)
		key := m.key.Load()
		if key != 0 && uint32(key>>32) == table {
			m.setKey(0)
			c.pt.remove(key)
			m.valid.Store(0)
			m.dirty.Store(0)
			c.zombies = append(c.zombies, id)
		}
	}
}

// reapZombiesLocked frees the frames of dropped tables that nobody holds any more.
func (c *pageCache) reapZombiesLocked() {
	keep := c.zombies[:0]
	for _, id := range c.zombies {
		m := c.meta(id)
		if m.pins.Load() > 0 {
			keep = append(keep, id)
			continue
		}
		m.mem.Store(nil)
		c.usedBytes -= frameCost(int(m.rowBytes))
		c.free = append(c.free, id)
	}
	c.zombies = keep
}

// bytesUsed reports the cache's accounted memory.
func (c *pageCache) bytesUsed() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.usedBytes
}

// takeTurn takes the cache turn (see pageCache.turn), parked until it is free, ctx ends
// (its error) or until (ErrCacheFull).
func (c *pageCache) takeTurn(ctx context.Context, until time.Time) error {
	select {
	case c.turn <- struct{}{}:
		return nil
	default:
	}
	timer := time.NewTimer(time.Until(until))
	defer timer.Stop()
	select {
	case c.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return fmt.Errorf("%w: waited %v for the cache turn", ErrCacheFull, c.waitMax)
	}
}

// giveTurn gives the cache turn back.
func (c *pageCache) giveTurn() { <-c.turn }
