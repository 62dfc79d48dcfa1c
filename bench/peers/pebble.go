package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"

	"github.com/weftdb/weft/bench"
)

// Pebble, the LSM of CockroachDB: its block cache is the txn-node cache's counterpart
// (--cache), its WAL is synced per commit (pebble-sync) or not (pebble-nosync). Update is a
// Get and a one-Set batch; ids come from an atomic counter.

type pebbleBackend struct {
	db       *pebble.DB
	dir      string
	wo       *pebble.WriteOptions
	rowBytes int
	next     atomic.Uint64
	bufs     sync.Pool // *[]byte row buffers for Update
}

// pebbleMemTableBytes is CockroachDB's memtable size (Pebble's default, 4 MiB, flushes a
// 3M-row load into hundreds of tiny tables).
const pebbleMemTableBytes = 64 << 20

func pebbleFactory(sync bool) bench.Factory {
	name, note := "pebble-nosync", "Pebble, WAL not synced; update = Get + one-Set batch"
	if sync {
		name, note = "pebble-sync", "Pebble, WAL synced per commit (grouped by Pebble's commit pipeline); update = Get + one-Set batch"
	}
	return bench.Factory{
		Name:           name,
		CacheSensitive: true,
		Note:           note + "; cache = block cache; hit = block cache hit ratio",
		Open: func(_ context.Context, cfg bench.OpenConfig) (bench.Backend, error) {
			return openPebble(cfg, sync)
		},
	}
}

// quietLogger drops Pebble's informational logs, which would interleave with the report.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any) {}
func (quietLogger) Errorf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pebble: "+format+"\n", args...)
}
func (quietLogger) Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pebble: "+format+"\n", args...)
	os.Exit(1)
}

func openPebble(cfg bench.OpenConfig, sync bool) (*pebbleBackend, error) {
	dir, err := os.MkdirTemp("", "peers-pebble-*")
	if err != nil {
		return nil, err
	}
	cache := pebble.NewCache(cfg.CacheBytes)
	defer cache.Unref() // the DB holds its own reference
	db, err := pebble.Open(dir, &pebble.Options{Cache: cache, MemTableSize: pebbleMemTableBytes, Logger: quietLogger{}})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p := &pebbleBackend{db: db, dir: dir, wo: pebble.NoSync, rowBytes: cfg.RowBytes}
	if sync {
		p.wo = pebble.Sync
	}
	p.bufs.New = func() any { b := make([]byte, cfg.RowBytes); return &b }
	return p, nil
}

func (p *pebbleBackend) Load(ctx context.Context, spec bench.LoadSpec) (uint64, error) {
	p.next.Store(uint64(spec.Records))
	err := loadParallel(ctx, spec, 0, func(ids []uint64, rows [][]byte) error {
		b := p.db.NewBatch()
		defer b.Close()
		for i, id := range ids {
			if err := b.Set(keyOf(id), rows[i], nil); err != nil {
				return err
			}
		}
		return b.Commit(pebble.NoSync)
	})
	if err != nil {
		return 0, err
	}
	return 0, p.db.Flush() // the loaded table on disk, as Weft's is in its WAL
}

func (p *pebbleBackend) Insert(_ context.Context, row []byte) (uint64, error) {
	id := p.next.Add(1) - 1
	return id, p.db.Set(keyOf(id), row, p.wo)
}

func (p *pebbleBackend) Get(_ context.Context, id uint64, dst []byte) error {
	v, closer, err := p.db.Get(keyOf(id))
	if err != nil {
		return err
	}
	copy(dst, v)
	return closer.Close()
}

func (p *pebbleBackend) Update(_ context.Context, id uint64, fn func([]byte) error) error {
	key := keyOf(id)
	v, closer, err := p.db.Get(key)
	if err != nil {
		return err
	}
	bp := p.bufs.Get().(*[]byte)
	defer p.bufs.Put(bp)
	row := *bp
	copy(row, v)
	if err := closer.Close(); err != nil {
		return err
	}
	if err := fn(row); err != nil {
		return err
	}
	b := p.db.NewBatch()
	defer b.Close()
	if err := b.Set(key, row, nil); err != nil {
		return err
	}
	return b.Commit(p.wo)
}

func (p *pebbleBackend) Delete(_ context.Context, id uint64) error {
	return p.db.Delete(keyOf(id), p.wo)
}

func (p *pebbleBackend) Stats() bench.Stats {
	m := p.db.Metrics()
	return bench.Stats{
		WALBytes:     m.WAL.BytesWritten,
		HasCache:     true,
		CacheLookups: uint64(m.BlockCache.Hits + m.BlockCache.Misses),
		CacheMisses:  uint64(m.BlockCache.Misses),
	}
}

func (p *pebbleBackend) Close() error {
	return errors.Join(p.db.Close(), os.RemoveAll(p.dir))
}
