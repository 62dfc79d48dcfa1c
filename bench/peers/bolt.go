package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"

	"github.com/weftdb/weft/bench"
)

// bbolt, the B+tree of etcd: one read-write transaction per write op (bbolt serialises them;
// each commit syncs unless --sync none), one read transaction per get. Ids come from the
// bucket's own sequence (NextSequence). It has no cache of its own (the OS page cache serves
// its mmap); "WAL bytes" are the bytes it writes to its data file, read from /proc/self/io.

var (
	boltBucket      = []byte("crud")
	errBoltNotFound = errors.New("bbolt: row not found")
)

type boltBackend struct {
	db  *bolt.DB
	dir string
}

func boltFactory() bench.Factory {
	return bench.Factory{
		Name: "bbolt",
		Note: "bbolt, one Update tx per write (synced per --sync), one View tx per get; WAL B/op = bytes written to its data file",
		Open: func(_ context.Context, cfg bench.OpenConfig) (bench.Backend, error) {
			dir, err := os.MkdirTemp("", "peers-bbolt-*")
			if err != nil {
				return nil, err
			}
			db, err := bolt.Open(filepath.Join(dir, "bolt.db"), 0o600, &bolt.Options{
				NoSync: cfg.Sync == "none", NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
			if err != nil {
				os.RemoveAll(dir)
				return nil, err
			}
			err = db.Update(func(tx *bolt.Tx) error {
				_, err := tx.CreateBucket(boltBucket)
				return err
			})
			if err != nil {
				db.Close()
				os.RemoveAll(dir)
				return nil, err
			}
			return &boltBackend{db: db, dir: dir}, nil
		},
	}
}

// boltLoadTx is how many rows one loading transaction writes.
const boltLoadTx = 100_000

// Load writes ids 1..Records in ascending order (bbolt has one writer), packing pages full,
// then sets the bucket's sequence past them. A value must stay unchanged until its
// transaction commits: each transaction's rows get a slab of their own.
func (b *boltBackend) Load(ctx context.Context, spec bench.LoadSpec) (uint64, error) {
	slab := make([]byte, min(spec.Records, boltLoadTx)*spec.RowBytes)
	for lo := 0; lo < spec.Records; lo += boltLoadTx {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		hi := min(lo+boltLoadTx, spec.Records)
		err := b.db.Update(func(tx *bolt.Tx) error {
			bk := tx.Bucket(boltBucket)
			bk.FillPercent = 1
			for i := lo; i < hi; i++ {
				id := uint64(i) + 1
				row := slab[(i-lo)*spec.RowBytes : (i-lo+1)*spec.RowBytes]
				spec.Row(row, id)
				if err := bk.Put(keyOf(id), row); err != nil {
					return err
				}
			}
			return bk.SetSequence(uint64(hi))
		})
		if err != nil {
			return 0, err
		}
		spec.Progress(hi - lo)
	}
	return 1, nil
}

func (b *boltBackend) Insert(_ context.Context, row []byte) (uint64, error) {
	var id uint64
	err := b.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(boltBucket)
		var err error
		if id, err = bk.NextSequence(); err != nil {
			return err
		}
		return bk.Put(keyOf(id), row)
	})
	return id, err
}

func (b *boltBackend) Get(_ context.Context, id uint64, dst []byte) error {
	return b.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(boltBucket).Get(keyOf(id))
		if v == nil {
			return errBoltNotFound
		}
		copy(dst, v)
		return nil
	})
}

func (b *boltBackend) Update(_ context.Context, id uint64, fn func([]byte) error) error {
	return b.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(boltBucket)
		key := keyOf(id)
		v := bk.Get(key)
		if v == nil {
			return errBoltNotFound
		}
		row := append([]byte(nil), v...) // v is valid only until the tx writes
		if err := fn(row); err != nil {
			return err
		}
		return bk.Put(key, row)
	})
}

func (b *boltBackend) Delete(_ context.Context, id uint64) error {
	return b.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(boltBucket).Delete(keyOf(id))
	})
}

func (b *boltBackend) Stats() bench.Stats {
	return bench.Stats{WALBytes: processWriteBytes()}
}

func (b *boltBackend) Close() error {
	return errors.Join(b.db.Close(), os.RemoveAll(b.dir))
}
