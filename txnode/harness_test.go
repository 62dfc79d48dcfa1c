package txnode

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode/store"
)

// The test harness: the configurations every behavioural test runs against, and Store wrappers
// that count or delay what the transaction node asks of its store.
//
// A configuration is a store deployment and a durability mode. Tests open a DB through
// openConfig.opener, which binds a fresh store; every DB the opener returns (the first one and
// every reopen) sees the same data. The remote store is one more entry: its store func
// (remoteStoreConfig) starts a storage node and sets Options.StoreAddr.

// openDB opens a DB with opts, failing the test on error; the caller closes it.
func openDB(t testing.TB, ctx context.Context, opts Options) *DB {
	t.Helper()
	db, err := Open(ctx, opts)
	require.NoError(t, err)
	return db
}

// newTable creates the table name of rowBytes-byte rows in db, failing the test on error.
func newTable(t testing.TB, ctx context.Context, db *DB, name string, rowBytes int) *Table {
	t.Helper()
	tb, err := db.CreateTable(ctx, name, rowBytes)
	require.NoError(t, err)
	return tb
}

// openTable opens the table name in db, failing the test on error.
func openTable(t testing.TB, ctx context.Context, db *DB, name string) *Table {
	t.Helper()
	tb, err := db.Table(ctx, name)
	require.NoError(t, err)
	return tb
}

// openTx begins a transaction in db (writable: Begin's argument), failing the test on error.
func openTx(t testing.TB, ctx context.Context, db *DB, writable bool) *Tx {
	t.Helper()
	tx, err := db.Begin(ctx, writable)
	require.NoError(t, err)
	return tx
}

// insertRow inserts r into tb, failing the test on error, and returns its id.
func insertRow(t testing.TB, ctx context.Context, tb *Table, r []byte) uint64 {
	t.Helper()
	id, err := tb.Insert(ctx, r)
	require.NoError(t, err)
	return id
}

// getTwo reads rows x and y of tb in tx into a and b (y only once x was read).
func getTwo(tx *Tx, tb *Table, x, y uint64, a, b []byte) error {
	if err := tx.Get(tb, x, a); err != nil {
		return err
	}
	return tx.Get(tb, y, b)
}

// openConfig is one way to run the transaction node.
type openConfig struct {
	name       string
	durability Durability
	// store binds a fresh store for one test and returns what sets an Options to use it.
	store func(t testing.TB) func(*Options)
}

// embeddedStore is the embedded deployment: a directory, WAL sync mode none (durable against
// a crash of the process, fast enough for tests; the sync mode is the store's business).
func embeddedStore(t testing.TB) func(*Options) {
	dir := t.TempDir()
	return func(o *Options) {
		o.Dir = dir
		if o.SyncMode == "" {
			o.SyncMode = "none"
		}
	}
}

// remoteStoreConfig is the two-process deployment, in one process: a storage node on 127.0.0.1:0
// over a fresh directory, reached over TCP. Every DB opened on it uses the same owner id, so a
// reopened node takes its tables back at once (as a restarted game server would).
func remoteStoreConfig(t testing.TB) func(*Options) {
	addr, _ := startStorageNodeWith(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone})
	return func(o *Options) {
		o.StoreAddr = addr
		if o.OwnerID == 0 {
			o.OwnerID = 1000
		}
	}
}

// openConfigs returns the configurations tests run against: the embedded store and a storage
// node over TCP, each in Durable and in WriteBack mode.
func openConfigs(t testing.TB) []openConfig {
	t.Helper()
	return []openConfig{
		{name: "embedded/durable", durability: Durable, store: embeddedStore},
		{name: "embedded/writeback", durability: WriteBack, store: embeddedStore},
		{name: "remote/durable", durability: Durable, store: remoteStoreConfig},
		{name: "remote/writeback", durability: WriteBack, store: remoteStoreConfig},
	}
}

// opener binds a fresh store and returns a function that opens a DB on it with opts (plus the
// configuration's durability and store); the DB is closed at the end of the test.
func (c openConfig) opener(t testing.TB) func(opts Options) *DB {
	t.Helper()
	setStore := c.store(t)
	return func(opts Options) *DB {
		t.Helper()
		opts.Durability = c.durability
		setStore(&opts)
		db := openDB(t, context.Background(), opts)
		t.Cleanup(func() { db.Close(context.Background()) })
		return db
	}
}

// newLocalStore opens an embedded store in a fresh directory, for tests that wrap it.
func newLocalStore(t testing.TB, dir string) store.Store {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	s, err := store.OpenEmbedded(storenode.Options{Dir: dir, Sync: storenode.SyncNone, ExpireLeasesAtOpen: true})
	require.NoError(t, err)
	return s
}

// countingStore counts the store calls the transaction node makes.
type countingStore struct {
	store.Store
	pageDirs, reads, readPages, commits atomic.Int64
}

func (s *countingStore) Read(ctx context.Context, reqs []base.PageWant, fill func(int, uint64, uint64, []byte)) error {
	s.reads.Add(1)
	s.readPages.Add(int64(len(reqs)))
	return s.Store.Read(ctx, reqs, fill)
}

func (s *countingStore) PageDir(ctx context.Context, table uint32, lo, hi uint64, max int, dst []store.PageInfo) ([]store.PageInfo, uint64, error) {
	s.pageDirs.Add(1)
	return s.Store.PageDir(ctx, table, lo, hi, max, dst)
}

func (s *countingStore) Commit(b *base.Batch, done func(uint64, error)) {
	s.commits.Add(1)
	s.Store.Commit(b, done)
}

func (s *countingStore) reset() {
	s.pageDirs.Store(0)
	s.reads.Store(0)
	s.readPages.Store(0)
	s.commits.Store(0)
}

// heldReadStore holds back the answer of one armed Read: it reads from the store at once
// (so the answer is what the store held then), reports that on entered, waits for release,
// and only then hands the answer to the transaction node. Other Reads pass through.
type heldReadStore struct {
	store.Store
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func newHeldReadStore(s store.Store) *heldReadStore {
	return &heldReadStore{Store: s, entered: make(chan struct{}), release: make(chan struct{})}
}

func (s *heldReadStore) Read(ctx context.Context, reqs []base.PageWant, fill func(int, uint64, uint64, []byte)) error {
	if !s.armed.CompareAndSwap(true, false) {
		return s.Store.Read(ctx, reqs, fill)
	}
	type answer struct {
		i           int
		data, clear uint64
		rows        []byte
	}
	var answers []answer
	err := s.Store.Read(ctx, reqs, func(i int, data, clear uint64, rows []byte) {
		answers = append(answers, answer{i, data, clear, append([]byte(nil), rows...)})
	})
	close(s.entered)
	<-s.release
	for _, a := range answers {
		fill(a.i, a.data, a.clear, a.rows)
	}
	return err
}

// ackStore acknowledges every commit batch at once, on the calling goroutine, without
// writing it anywhere; every other call goes to the store it wraps. With it the allocation
// tests measure the transaction node's own commit path, not the store's.
type ackStore struct {
	store.Store
	mu  sync.Mutex
	lsn uint64
}

func (s *ackStore) Commit(_ *base.Batch, done func(uint64, error)) {
	s.mu.Lock()
	s.lsn++
	lsn := s.lsn
	s.mu.Unlock()
	done(lsn, nil)
}

// u64Row returns a row of rowBytes bytes whose first word is v and whose other words are
// derived from v and their position, so a torn or misplaced row is caught.
func u64Row(rowBytes int, v uint64) []byte {
	b := make([]byte, rowBytes)
	fillRow(b, v)
	return b
}

func fillRow(b []byte, v uint64) {
	binary.LittleEndian.PutUint64(b, v)
	for off := 8; off+8 <= len(b); off += 8 {
		binary.LittleEndian.PutUint64(b[off:], v*0x9E3779B97F4A7C15^uint64(off))
	}
}

// checkRow asserts that b is a row fillRow wrote and returns its value.
func checkRow(t testing.TB, b []byte) uint64 {
	t.Helper()
	v := binary.LittleEndian.Uint64(b)
	for off := 8; off+8 <= len(b); off += 8 {
		if got := binary.LittleEndian.Uint64(b[off:]); got != v*0x9E3779B97F4A7C15^uint64(off) {
			require.Failf(t, "torn row", "row of value %d has word %d = %#x", v, off/8, got)
		}
	}
	return v
}

// recvWithin receives from ch, failing the test if nothing comes for a long time: a
// watchdog, so a hang fails the test instead of stalling the run (no timing depends on it).
func recvWithin[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		require.FailNow(t, "timed out waiting for "+what)
		var zero T
		return zero
	}
}

// eachConfig runs f as a subtest of each configuration of cfgs (openConfigs, or a part of
// it), on a DB its opener opened with opts.
func eachConfig(t *testing.T, cfgs []openConfig, opts Options, f func(t *testing.T, db *DB)) {
	t.Helper()
	for _, cfg := range cfgs {
		t.Run(cfg.name, func(t *testing.T) { f(t, cfg.opener(t)(opts)) })
	}
}

// boolSubtests runs f as two subtests: off, of f(t, false), then on, of f(t, true).
func boolSubtests(t *testing.T, off, on string, f func(t *testing.T, b bool)) {
	t.Helper()
	t.Run(off, func(t *testing.T) { f(t, false) })
	t.Run(on, func(t *testing.T) { f(t, true) })
}
