package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/store"
)

// WeftEngine is the name of the Weft backend in reports.
const WeftEngine = "weft"

// weftDeploy says where the Weft backend's storage node lives.
type weftDeploy struct {
	// storeAddr is a storage node's address; empty for the embedded store.
	storeAddr string
	secret    []byte
	// storeCacheBytes is the embedded store's disk page cache.
	storeCacheBytes int64
	// tempDir is where the embedded store's directory is made ("" = os.TempDir()).
	tempDir string
	// fullPageIO asks for whole-page fetch and ship (an ablation txnode does not offer yet).
	fullPageIO bool
	// storePID is the spawned storage node's process id (its CPU time counts), or 0.
	storePID int
	// syncNone is set when the store does not fsync commits (sync mode none). The log's
	// fsyncs are then id grants and checkpoints, not group commits, so ops per sync is not
	// reported: it would be a large number that means nothing.
	syncNone bool
}

func weftFactory(d weftDeploy) Factory {
	return Factory{
		Name:           WeftEngine,
		CacheSensitive: true,
		Open: func(ctx context.Context, cfg OpenConfig) (Backend, error) {
			return openWeft(ctx, cfg, d)
		},
	}
}

// weftBackend runs the workloads on one txnode.DB and one table.
type weftBackend struct {
	db  *txnode.DB
	t   *txnode.Table
	dep weftDeploy

	dir string      // embedded: the store's directory, removed at Close
	fs  *countingFS // embedded: counts WAL bytes

	walMu    sync.Mutex
	walLast  uint64 // remote: the store's WAL bytes at the last successful stats request
	syncLast uint64 // and its WAL syncs
}

// parseDurability parses a run's durability: durable (the default, "") or writeback.
func parseDurability(s string) (txnode.Durability, error) {
	switch s {
	case "", "durable":
		return txnode.Durable, nil
	case "writeback":
		return txnode.WriteBack, nil
	}
	return 0, fmt.Errorf("bench: durability %q: want durable or writeback", s)
}

// warnLogger is the benchmarks' logger of Weft's components: warnings and above, to stderr.
func warnLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func openWeft(ctx context.Context, cfg OpenConfig, d weftDeploy) (_ *weftBackend, err error) {
	durability, err := parseDurability(cfg.Durability)
	if err != nil {
		return nil, err
	}
	logger := warnLogger()
	w := &weftBackend{dep: d}
	opts := txnode.Options{CacheBytes: cfg.CacheBytes, Durability: durability, Logger: logger, FullPageIO: d.fullPageIO}
	name := "crud"
	if d.storeAddr != "" {
		opts.StoreAddr, opts.Secret = d.storeAddr, d.secret
		// A storage node outlives us and may hold other runs' tables: make ours unique.
		name = fmt.Sprintf("crud-%d-%d", os.Getpid(), time.Now().UnixNano())
	} else {
		sync, ok := storenode.ParseSyncMode(cfg.Sync)
		if !ok {
			return nil, fmt.Errorf("bench: sync mode %q: want always or none", cfg.Sync)
		}
		w.dir, err = os.MkdirTemp(d.tempDir, "crudbench-*")
		if err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				os.RemoveAll(w.dir)
			}
		}()
		// The same store txnode.Open makes for Options.Dir, over a file system that counts
		// the WAL's bytes.
		w.fs = newCountingFS(vfs.Default, filepath.Join(w.dir, "wal"))
		st, err := store.OpenEmbedded(storenode.Options{Dir: w.dir, FS: w.fs, Sync: sync,
			CacheBytes: d.storeCacheBytes, Logger: logger, ExpireLeasesAtOpen: true})
		if err != nil {
			return nil, err
		}
		opts.Store = st
	}
	w.db, err = txnode.Open(ctx, opts)
	if err != nil {
		if opts.Store != nil {
			opts.Store.Close()
		}
		return nil, err
	}
	w.t, err = w.db.CreateTable(ctx, name, cfg.RowBytes)
	if err != nil {
		w.db.Close(ctx)
		return nil, err
	}
	return w, nil
}

// weftLoadWindow is how many inserts each loading goroutine keeps in flight.
const weftLoadWindow = 64

// Load inserts the rows with asynchronous sessions: each goroutine keeps weftLoadWindow
// transactions in flight, so commits group into large batches.
func (w *weftBackend) Load(ctx context.Context, spec LoadSpec) (uint64, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var lo, hi atomic.Uint64
	lo.Store(^uint64(0))
	var wg sync.WaitGroup
	for g := range spec.Workers {
		n := spec.Records / spec.Workers
		if g < spec.Records%spec.Workers {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.loadPart(ctx, spec, n, &lo, &hi); err != nil {
				cancel(err)
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return 0, fmt.Errorf("bench: load weft: %w", err)
	}
	if spec.Records == 0 {
		return 0, nil
	}
	first, last := lo.Load(), hi.Load()
	if last-first+1 != uint64(spec.Records) {
		return 0, fmt.Errorf("bench: load weft: ids %d..%d are not %d dense ids", first, last, spec.Records)
	}
	return first, nil
}

func (w *weftBackend) loadPart(ctx context.Context, spec LoadSpec, n int, lo, hi *atomic.Uint64) error {
	s := w.db.Session()
	row := make([]byte, spec.RowBytes)
	var id uint64
	minID, maxID := ^uint64(0), uint64(0)
	insert := func(tx *txnode.Tx) error {
		var err error
		if id, err = tx.Insert(w.t, row); err != nil {
			return err
		}
		spec.Row(row, id) // the id is known only now: rewrite the row in the same tx
		return tx.Put(w.t, id, row)
	}
	ring := make([]*txnode.Pending, 0, weftLoadWindow)
	head, done := 0, 0
	for i := range n {
		if len(ring) == weftLoadWindow {
			if err := ring[head].Wait(ctx); err != nil {
				return err
			}
			ring[head] = s.Go(ctx, insert)
			head = (head + 1) % weftLoadWindow
		} else {
			ring = append(ring, s.Go(ctx, insert))
		}
		minID, maxID = min(minID, id), max(maxID, id)
		if done++; done == 1024 || i == n-1 {
			spec.Progress(done)
			done = 0
		}
	}
	if err := s.Flush(ctx); err != nil {
		return err
	}
	for _, p := range ring {
		if err := p.Wait(ctx); err != nil {
			return err
		}
	}
	for v := lo.Load(); minID < v && !lo.CompareAndSwap(v, minID); v = lo.Load() {
	}
	for v := hi.Load(); maxID > v && !hi.CompareAndSwap(v, maxID); v = hi.Load() {
	}
	return nil
}

func (w *weftBackend) Insert(ctx context.Context, row []byte) (uint64, error) {
	return w.t.Insert(ctx, row)
}

func (w *weftBackend) Get(ctx context.Context, id uint64, dst []byte) error {
	return w.t.Get(ctx, id, dst)
}

func (w *weftBackend) Update(ctx context.Context, id uint64, fn func(row []byte) error) error {
	return w.t.Update(ctx, id, fn)
}

func (w *weftBackend) Delete(ctx context.Context, id uint64) error {
	return w.t.Delete(ctx, id)
}

// Stats reads the node's cache counters, the WAL bytes (counted at the file system when
// embedded, asked of the storage node otherwise) and the TCP bytes to the storage node.
func (w *weftBackend) Stats() Stats {
	s := w.db.Stats()
	st := Stats{HasCache: true, CacheMisses: s.PageMisses}
	if w.fs != nil {
		st.WALBytes, st.WALSyncs = w.fs.walBytes.Load(), w.fs.walSyncs.Load()
	} else {
		st.NetBytes = TCPBytes(w.dep.storeAddr) // before the stats connection opens
		st.WALBytes, st.WALSyncs = w.remoteWAL()
		if w.dep.storePID != 0 {
			st.ServerCPU = ProcessCPU(w.dep.storePID)
		}
	}
	if w.dep.syncNone {
		st.WALSyncs = 0
	}
	return st
}

// remoteWAL asks the storage node for its WAL counters; on failure it repeats the last
// values (the report then shows no WAL traffic rather than failing the run).
func (w *weftBackend) remoteWAL() (bytes, syncs uint64) {
	w.walMu.Lock()
	defer w.walMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stats, err := StoreStats(ctx, w.dep.storeAddr, w.dep.secret)
	if err == nil {
		if v, ok := walBytesStat(stats); ok {
			w.walLast = v
		}
		if v, ok := stats["wal_syncs"]; ok {
			w.syncLast = v
		}
	}
	return w.walLast, w.syncLast
}

// walBytesStat finds the WAL byte counter among a storage node's stats.
func walBytesStat(stats map[string]uint64) (uint64, bool) {
	for _, name := range []string{"wal_bytes", "wal.bytes", "WALBytes", "walBytes"} {
		if v, ok := stats[name]; ok {
			return v, true
		}
	}
	for name, v := range stats {
		if n := strings.ToLower(name); strings.Contains(n, "wal") && strings.Contains(n, "bytes") {
			return v, true
		}
	}
	return 0, false
}

// StoreStats asks the storage node at addr for its counters over a connection of its own.
func StoreStats(ctx context.Context, addr string, secret []byte) (map[string]uint64, error) {
	c, err := sgio.Dial(ctx, sgio.ClientConfig{Addr: addr, Secret: secret, Name: "crudbench-stats"})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	var reply sgio.StatsReply
	if err := c.CallInto(ctx, &sgio.Stats{}, &reply); err != nil {
		return nil, err
	}
	out := make(map[string]uint64, len(reply.Stats))
	for _, s := range reply.Stats {
		out[s.Name] = s.Value
	}
	return out, nil
}

// Close drops the table on a storage node (it is ours alone), closes the node and removes
// the embedded store's directory.
func (w *weftBackend) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var err error
	if w.dep.storeAddr != "" {
		err = w.db.DropTable(ctx, w.t.Name())
	}
	err = errors.Join(err, w.db.Close(ctx))
	if w.dir != "" {
		err = errors.Join(err, os.RemoveAll(w.dir))
	}
	return err
}

// NewSession returns an asynchronous session (--async): one txnode.Session.
func (w *weftBackend) NewSession() AsyncSession {
	s := &weftSession{s: w.db.Session(), t: w.t}
	s.fn = s.run
	return s
}

// weftSession starts each op with Session.Go. The op's arguments live in the session, and fn
// is bound once, so starting an op allocates only what Session.Go does: Go runs fn before it
// returns (retries included) and never after.
type weftSession struct {
	s  *txnode.Session
	t  *txnode.Table
	fn func(tx *txnode.Tx) error

	kind opKind
	id   uint64
	row  []byte
	ufn  func([]byte) error
}

type opKind uint8

const (
	opInsert opKind = iota
	opGet
	opUpdate
	opDelete
)

func (s *weftSession) run(tx *txnode.Tx) error {
	var err error
	switch s.kind {
	case opInsert:
		s.id, err = tx.Insert(s.t, s.row)
	case opGet:
		err = tx.Get(s.t, s.id, s.row)
	case opUpdate:
		err = tx.Update(s.t, s.id, s.ufn)
	case opDelete:
		err = tx.Delete(s.t, s.id)
	}
	return err
}

func (s *weftSession) start(ctx context.Context, kind opKind, id uint64, row []byte, ufn func([]byte) error) *txnode.Pending {
	s.kind, s.id, s.row, s.ufn = kind, id, row, ufn
	p := s.s.Go(ctx, s.fn)
	s.row, s.ufn = nil, nil
	return p
}

func (s *weftSession) Insert(ctx context.Context, row []byte) (uint64, Pending) {
	p := s.start(ctx, opInsert, 0, row, nil)
	return s.id, p
}

func (s *weftSession) Get(ctx context.Context, id uint64, dst []byte) Pending {
	return s.start(ctx, opGet, id, dst, nil)
}

func (s *weftSession) Update(ctx context.Context, id uint64, fn func([]byte) error) Pending {
	return s.start(ctx, opUpdate, id, nil, fn)
}

func (s *weftSession) Delete(ctx context.Context, id uint64) Pending {
	return s.start(ctx, opDelete, id, nil, nil)
}
