package storenode

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testseed"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
)

// Benchmarks of the storage engine on the real file system (vfs.Default, a temporary
// directory): commit throughput per sync mode, batch size and concurrency; sparse reads from
// the disk page cache; recovery speed; commit latency while a checkpoint runs; the cost of
// publishing the page map of 30M rows; and, in the same run, the disk's own limit (one
// fdatasync per append), the ceiling of sync=always with one committer. docs/storage.md
// ("Measured") has the numbers and the commands.

const (
	benchOwner     = 2
	benchTableRows = 1 << 20 // 64 MiB of 64-byte rows: 16384 pages
)

// benchEngine opens an engine in a fresh directory with one table of 64-byte rows, owned.
func benchEngine(b *testing.B, opts Options) (*Engine, uint32, []base.Fence) {
	b.Helper()
	if opts.Dir == "" {
		opts.Dir = b.TempDir()
	}
	if opts.CheckpointInterval == 0 {
		opts.CheckpointInterval = time.Hour
	}
	opts.Logger = quietLogger
	e, info, g := benchTable(b, opts, benchTableRows/logicpage.RowsPerPage)
	return e, info.ID, []base.Fence{{Table: info.ID, Epoch: g.Epoch}}
}

// benchTable opens an engine with opts (closed when b ends), creates the table "bench" of
// 64-byte rows, takes benchOwner's grant of it and grants that owner the ids of its first
// pages pages.
func benchTable(b *testing.B, opts Options, pages int) (*Engine, base.TableInfo, base.Grant) {
	b.Helper()
	e, err := Open(opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	info, err := e.CreateTable("bench", 64)
	if err != nil {
		b.Fatal(err)
	}
	g, err := e.Acquire(info.ID, benchOwner, 0)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := grantPages(e, info.ID, benchOwner, g.Epoch, pages); err != nil {
		b.Fatal(err)
	}
	return e, info, g
}

// benchCommitter hands batches of one owner to Commit with up to inflight of them waiting
// for their acknowledgement, as inflight committing goroutines of one transaction node
// would. A batch writes rows consecutive rows from a random id: 1 row, part of a page, or
// several whole pages.
type benchCommitter struct {
	e       *Engine
	table   uint32
	fences  []base.Fence
	rows    int
	rng     *rand.Rand
	seq     uint64
	buf     []byte
	segs    []base.Segment
	slots   chan struct{}
	errMu   sync.Mutex
	err     error
	done    func(uint64, error)
	pending sync.WaitGroup
}

func newBenchCommitter(e *Engine, table uint32, fences []base.Fence, rows, inflight int) *benchCommitter {
	c := &benchCommitter{
		e: e, table: table, fences: fences, rows: rows,
		rng:   rand.New(rand.NewPCG(1, uint64(rows))),
		buf:   make([]byte, rows*64),
		slots: make(chan struct{}, inflight),
	}
	fillRow(c.buf, table, 0, 1)
	c.done = func(_ uint64, err error) {
		if err != nil {
			c.errMu.Lock()
			c.err = err
			c.errMu.Unlock()
		}
		<-c.slots
		c.pending.Done()
	}
	return c
}

// commit sends one batch, waiting first for a free slot. Commit copies the batch, so its
// buffers are reused at once.
func (c *benchCommitter) commit() {
	c.slots <- struct{}{}
	c.pending.Add(1)
	first := c.rng.Uint64N(benchTableRows - uint64(c.rows))
	c.segs = c.segs[:0]
	for id, left := first, c.rows; left > 0; {
		page, slot := logicpage.PageOf(id)
		n := min(left, 64-slot)
		mask := (uint64(1)<<n - 1) << slot
		if n == 64 {
			mask = ^uint64(0)
		}
		off := (c.rows - left) * 64
		c.segs = append(c.segs, base.Segment{Table: c.table, Page: page, Data: mask, Rows: c.buf[off : off+n*64]})
		id += uint64(n)
		left -= n
	}
	c.seq++
	c.e.Commit(&base.Batch{Owner: benchOwner, Seq: c.seq, Fences: c.fences, Segments: c.segs}, c.done)
}

func (c *benchCommitter) wait(b *testing.B) {
	c.pending.Wait()
	if c.err != nil {
		b.Fatal(c.err)
	}
}

// BenchmarkCommit measures batches/s (1/ns/op) and rows/s by sync mode, rows per batch and
// committers (batches in flight).
func BenchmarkCommit(b *testing.B) {
	for _, mode := range []SyncMode{SyncAlways, SyncNone} {
		for _, rows := range []int{1, 16, 256} {
			for _, committers := range []int{1, 16, 128} {
				b.Run(fmt.Sprintf("sync=%s/rows=%d/committers=%d", mode, rows, committers), func(b *testing.B) {
					e, table, fences := benchEngine(b, Options{Sync: mode})
					c := newBenchCommitter(e, table, fences, rows, committers)
					b.ReportAllocs()
					b.SetBytes(int64(rows * 64))
					start := time.Now()
					for b.Loop() {
						c.commit()
					}
					c.wait(b)
					elapsed := time.Since(start).Seconds()
					b.ReportMetric(float64(b.N)/elapsed, "batches/s")
					b.ReportMetric(float64(b.N*rows)/elapsed, "rows/s")
				})
			}
		}
	}
}

// BenchmarkReadRows measures sparse reads of random rows: from the disk page cache (every
// page cached) and, with a 1 MiB cache, from the data file (the OS page cache, in practice).
func BenchmarkReadRows(b *testing.B) {
	for _, cache := range []string{"hit", "miss"} {
		for _, rows := range []int{1, 8} {
			b.Run(fmt.Sprintf("cache=%s/rows=%d", cache, rows), func(b *testing.B) {
				opts := Options{CheckpointWALBytes: -1}
				if cache == "miss" {
					opts.CacheBytes = 1 << 20
				}
				e, table, fences := benchEngine(b, opts)
				loadBenchTable(b, e, table, fences)
				pages := uint64(benchTableRows / 64)
				if cache == "hit" {
					for p := range pages {
						if _, _, _, err := e.ReadRows(table, p, 1, nil); err != nil {
							b.Fatal(err)
						}
					}
				}
				rng := rand.New(rand.NewPCG(3, 4))
				dst := make([]byte, 0, rows*64)
				b.ReportAllocs()
				for b.Loop() {
					page := rng.Uint64N(pages)
					want := uint64(1) << rng.IntN(64)
					if rows > 1 {
						want = rng.Uint64() | 1
						for bits.OnesCount64(want) > rows {
							want &= want - 1
						}
					}
					var err error
					if _, _, dst, err = e.ReadRows(table, page, want, dst[:0]); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N*rows)/b.Elapsed().Seconds(), "rows/s")
			})
		}
	}
}

// loadBenchTable fills the whole table with full-page batches and checkpoints it.
func loadBenchTable(b *testing.B, e *Engine, table uint32, fences []base.Fence) {
	b.Helper()
	c := newBenchCommitter(e, table, fences, 64, 64)
	for page := range uint64(benchTableRows / 64) {
		c.slots <- struct{}{}
		c.pending.Add(1)
		c.seq++
		e.Commit(&base.Batch{Owner: benchOwner, Seq: c.seq, Fences: fences,
			Segments: []base.Segment{{Table: table, Page: page, Data: ^uint64(0), Rows: c.buf}}}, c.done)
	}
	c.wait(b)
	if err := e.Checkpoint(); err != nil {
		b.Fatal(err)
	}
}

// abandon stops an engine without its final checkpoint, as kill -9 would, but releases its
// files and locks so the store can be opened again in this process.
func abandon(e *Engine) {
	e.mu.Lock()
	e.closed = true
	e.cond.Broadcast()
	e.mu.Unlock()
	close(e.stop)
	e.bg.Wait()
	e.log.Close()
	e.closeFiles()
}

// BenchmarkRecovery measures Open of a store whose WAL holds a large tail after its
// checkpoint (64 MiB; 1 GiB with WEFT_SOAK=1): batches of 256 rows over 64 MiB of pages, all
// synced. The WAL is in the OS page cache; the figure is the replay's speed, not the disk's.
func BenchmarkRecovery(b *testing.B) {
	walBytes := int64(64 << 20)
	if testseed.Soak() {
		walBytes = 1 << 30
	}
	dir := b.TempDir()
	walBytes, err := buildRecoveryStore(dir, walBytes)
	if err != nil {
		b.Fatal(err)
	}
	opts := Options{Dir: dir, Logger: quietLogger, CheckpointInterval: time.Hour}
	b.SetBytes(walBytes)
	b.ReportAllocs()
	for b.Loop() {
		e, err := Open(opts)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		abandon(e) // no checkpoint: every iteration replays the same WAL
		b.StartTimer()
	}
	b.ReportMetric(float64(walBytes)/1e6/(b.Elapsed().Seconds()/float64(b.N)), "MB/s")
}

func buildRecoveryStore(dir string, walBytes int64) (int64, error) {
	opts := Options{Dir: dir, Logger: quietLogger, CheckpointWALBytes: -1, CheckpointInterval: -1}
	e, err := Open(opts)
	if err != nil {
		return 0, err
	}
	info, err := e.CreateTable("bench", 64)
	if err != nil {
		return 0, err
	}
	g, err := e.Acquire(info.ID, benchOwner, 0)
	if err != nil {
		return 0, err
	}
	if _, err := grantPages(e, info.ID, benchOwner, g.Epoch, benchTableRows/logicpage.RowsPerPage); err != nil {
		return 0, err
	}
	c := newBenchCommitter(e, info.ID, []base.Fence{{Table: info.ID, Epoch: g.Epoch}}, 256, 64)
	for e.Stats().WALBytes < uint64(walBytes) {
		for range 1024 {
			c.commit()
		}
	}
	c.pending.Wait()
	if c.err != nil {
		return 0, c.err
	}
	got := int64(e.Stats().WALBytes)
	abandon(e)
	return got, nil
}

// BenchmarkCheckpointStall runs checkpoints (one per op, each after commitsPerCheckpoint
// more commits) while 16 committers commit random single rows, and reports the longest commit latency seen while a checkpoint ran
// (max-commit-us) and the engine's LongestStall (a commit waiting for the cache to make room).
// With cache=large every page fits and nothing stalls on the cache; with cache=small (4 MiB
// for the 64 MiB table) commits that miss wait for checkpoints. Under sync=none the
// checkpoint's WAL sync runs on the WAL's writer, so every commit queued meanwhile waits for
// it.
func BenchmarkCheckpointStall(b *testing.B) {
	for _, mode := range []SyncMode{SyncAlways, SyncNone} {
		for _, cache := range []string{"large", "small"} {
			b.Run(fmt.Sprintf("sync=%s/cache=%s", mode, cache), func(b *testing.B) {
				benchCheckpointStall(b, mode, cache)
			})
		}
	}
}

// commitsPerCheckpoint is how many single-row commits run before each checkpoint of
// BenchmarkCheckpointStall: about as many dirty pages, 16 MiB of them.
const commitsPerCheckpoint = 4096

func benchCheckpointStall(b *testing.B, mode SyncMode, cache string) {
	opts := Options{Sync: mode, CheckpointWALBytes: -1}
	if cache == "small" {
		opts.CacheBytes = 4 << 20
	}
	e, table, fences := benchEngine(b, opts)
	var (
		mu         sync.Mutex
		seq        uint64
		acked      uint64
		maxLatency time.Duration
		inCkpt     bool
		stop       = make(chan struct{})
		wg         sync.WaitGroup
	)
	moreAcked := sync.NewCond(&mu)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 5))
			row := make([]byte, 64)
			for {
				select {
				case <-stop:
					return
				default:
				}
				id := rng.Uint64N(benchTableRows)
				mu.Lock()
				seq++
				batch := &base.Batch{Owner: benchOwner, Seq: seq, Fences: fences, Segments: []base.Segment{oneRow(table, id, row)}}
				ch := make(chan error, 1)
				start := time.Now()
				e.Commit(batch, func(_ uint64, err error) { ch <- err })
				mu.Unlock()
				if err := <-ch; err != nil {
					b.Error(err)
					return
				}
				d := time.Since(start)
				mu.Lock()
				if inCkpt && d > maxLatency {
					maxLatency = d
				}
				acked++
				moreAcked.Broadcast()
				mu.Unlock()
			}
		}()
	}
	for b.Loop() {
		// The same amount of work for every checkpoint: commitsPerCheckpoint more rows.
		mu.Lock()
		for target := acked + commitsPerCheckpoint; acked < target; {
			moreAcked.Wait()
		}
		inCkpt = true
		mu.Unlock()
		if err := e.Checkpoint(); err != nil {
			b.Fatal(err)
		}
		mu.Lock()
		inCkpt = false
		mu.Unlock()
	}
	close(stop)
	wg.Wait()
	st := e.Stats()
	b.ReportMetric(float64(maxLatency.Microseconds()), "max-commit-us")
	b.ReportMetric(float64(st.LongestStall.Microseconds()), "longest-stall-us")
	b.ReportMetric(float64(st.CheckpointPages)/float64(st.Checkpoints), "pages/ckpt")
}

// BenchmarkMetaPublish measures at 30M rows of 64 bytes (468,750 page-map entries) what a
// map log compaction encodes (op=compact-encode: every leaf, encodeMapLog) and what every
// checkpoint publishes (op=publish: the meta file without the maps: encode, write meta.tmp,
// fsync, rename, fsync the directory).
func BenchmarkMetaPublish(b *testing.B) {
	const pages = 30_000_000 / 64
	m := &metaState{ckptLSN: 1, nextTable: 2, owners: map[uint64]ownerState{1: {lastSeq: 9, lastLSN: 1}}}
	pm := (*pageMap)(nil).edit()
	for i := range uint64(pages) {
		pm.set(i, mapEntry{disk: uint32(i + 1), crc: uint32(i * 7), lsn: i, present: ^uint64(0)})
	}
	pm.seal()
	m.tables = []metaTable{{id: 1, rowBytes: 64, name: "items", nextID: 30_000_000, pages: pm}}
	b.Run("op=compact-encode", func(b *testing.B) {
		b.SetBytes(int64(len(encodeMapLog(m, 1))))
		b.ReportAllocs()
		for b.Loop() {
			encodeMapLog(m, 1)
		}
	})
	b.Run("op=publish", func(b *testing.B) {
		dir := b.TempDir()
		b.SetBytes(int64(len(encodeMeta(m))))
		b.ReportAllocs()
		for b.Loop() {
			if err := publishMeta(vfs.Default, dir, m); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkDiskSync is the disk's own limit, measured beside the engine in the same run and
// the same temporary directory: appends of one WAL-record-sized write (256 bytes), each
// followed by one fdatasync, into a file grown by the writes (alloc=none), preallocated with
// fallocate(KEEP_SIZE) as the WAL does (alloc=fallocate), or written with zeros and synced
// beforehand (alloc=written: no extent or size change left for fdatasync to journal).
func BenchmarkDiskSync(b *testing.B) {
	const size, region = 256, 64 << 20
	for _, alloc := range []string{"none", "fallocate", "written"} {
		b.Run("alloc="+alloc, func(b *testing.B) {
			f, err := vfs.Default.Create(filepath.Join(b.TempDir(), "appends"))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			switch alloc {
			case "fallocate":
				err = f.Allocate(0, region)
			case "written":
				if _, err = f.WriteAt(make([]byte, region), 0); err == nil {
					err = f.Sync()
				}
			}
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, size)
			off := int64(0)
			b.SetBytes(size)
			for b.Loop() {
				if _, err := f.WriteAt(buf, off); err != nil {
					b.Fatal(err)
				}
				if err := f.Sync(); err != nil {
					b.Fatal(err)
				}
				if off += size; off == region {
					off = 0
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
		})
	}
}
