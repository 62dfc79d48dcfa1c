package hashindex_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/hashindex"
	"github.com/weftdb/weft/internal/corrupt"
)

// TestFastPathCatchesSwappedIDs: the cache-hit Lookup trusts a primary row at the version it
// verified it at (before 2x: whose memo fold was the one verified), so a row changed since
// is never trusted unchecked. A row whose ids of two entries were swapped (the checksum
// field kept, as a raw Table write that reorders entries would leave it) maps two keys to
// each other's ids: its checksum fails, so Lookup must report corruption or the right id,
// never the other key's id. The xor fold put both ids in one lane (16-byte keys: entries 0
// and 1, words 5 and 8; 8-byte keys: entries 0 and 3, words 4 and 10), where a swap
// cancels: on 505c87f Lookup returned the swapped ids as data.
func TestFastPathCatchesSwappedIDs(t *testing.T) {
	for _, c := range []struct{ kb, i, j int }{{16, 0, 1}, {8, 0, 3}} {
		t.Run(fmt.Sprintf("key=%d", c.kb), func(t *testing.T) {
			ctx := context.Background()
			db := openDB(t, t.TempDir())
			defer func() { db.Close(ctx) }()
			ix := createIndex(t, ctx, db, "a", hashindex.Options{KeyBytes: c.kb, Unique: true})
			key := func(i int) []byte {
				if c.kb == 16 {
					return playerName(i)
				}
				return key8(i)
			}
			n := 60
			for i := range n {
				require.NoError(t, ix.Insert(ctx, key(i), uint64(i)+1))
			}
			for i := range n { // verified, then fast
				id, err := ix.Lookup(ctx, key(i))
				require.NoError(t, err)
				require.Equal(t, uint64(i)+1, id)
			}
			row := make([]byte, ix.Table().RowBytes())
			e := c.kb + 8
			swapped := 0
			for _, bid := range rowsOfKind(t, ix.Table(), 1) {
				require.NoError(t, ix.Table().Get(ctx, bid, row))
				if int(binary.LittleEndian.Uint16(row[6:])) <= c.j {
					continue
				}
				a, b := 24+c.i*e+c.kb, 24+c.j*e+c.kb
				ida, idb := binary.LittleEndian.Uint64(row[a:]), binary.LittleEndian.Uint64(row[b:])
				binary.LittleEndian.PutUint64(row[a:], idb)
				binary.LittleEndian.PutUint64(row[b:], ida)
				require.NoError(t, ix.Table().Put(ctx, bid, row))
				swapped++
			}
			require.NotZero(t, swapped)
			damaged := 0
			for i := range n {
				id, err := ix.Lookup(ctx, key(i))
				if err != nil {
					require.ErrorIs(t, err, corrupt.ErrCorruption)
					damaged++
					continue
				}
				require.Equal(t, uint64(i)+1, id, "key %d: another key's id returned as data", i)
			}
			require.NotZero(t, damaged)
		})
	}
}

// TestLookupTornBucketRow: a writer rewrites a bucket's primary row through the raw Table
// API, alternating the row as the index wrote it and a damaged one (random entries, a count
// anywhere in 0..65535, the header fields of the bucket kept), while Lookup reads it in place
// (txnode's View: a run may see the row half rewritten, its count from one version and its
// entries from the other). Lookup must never panic, slice out of the row or return an id
// that is not the key's: the right id or corruption.
func TestLookupTornBucketRow(t *testing.T) {
	lookups, puts := 20000, int64(2000)
	if testing.Short() {
		lookups, puts = 3000, 300
	}
	for _, kb := range []int{16, 8} {
		t.Run(fmt.Sprintf("key=%d", kb), func(t *testing.T) {
			ctx := context.Background()
			db := openDB(t, t.TempDir())
			defer func() { db.Close(ctx) }()
			ix := createIndex(t, ctx, db, "a", hashindex.Options{KeyBytes: kb, Unique: true})
			key := func(i int) []byte {
				if kb == 16 {
					return playerName(i)
				}
				return key8(i)
			}
			n := 4 // one bucket, one row
			for i := range n {
				require.NoError(t, ix.Insert(ctx, key(i), uint64(i)+1))
			}
			bids := rowsOfKind(t, ix.Table(), 1)
			require.Len(t, bids, 1)
			good := make([]byte, ix.Table().RowBytes())
			require.NoError(t, ix.Table().Get(ctx, bids[0], good))
			bad := make([]byte, len(good))
			rng := rand.New(rand.NewPCG(uint64(kb), 1))
			stop := make(chan struct{})
			var written atomic.Int64
			writerDone := make(chan error, 1)
			go func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						writerDone <- nil
						return
					default:
					}
					row := good
					if i%2 == 1 {
						for j := range bad {
							bad[j] = byte(rng.Uint32())
						}
						copy(bad[4:6], good[4:6]) // kind, level
						copy(bad[8:16], good[8:16])
						binary.LittleEndian.PutUint16(bad[6:], uint16(rng.Uint32()))
						binary.LittleEndian.PutUint64(bad[16:], 0)
						row = bad
					}
					if err := ix.Table().Put(ctx, bids[0], row); err != nil {
						writerDone <- err
						return
					}
					written.Add(1)
				}
			}()
			found := 0
			i := 0
			for ; i < lookups || written.Load() < puts; i++ {
				k := i % n
				id, err := ix.Lookup(ctx, key(k))
				if err != nil {
					if !errors.Is(err, corrupt.ErrCorruption) {
						close(stop)
						<-writerDone
						require.ErrorIs(t, err, corrupt.ErrCorruption)
					}
					continue
				}
				if id != uint64(k)+1 {
					close(stop)
					<-writerDone
					require.Equal(t, uint64(k)+1, id, "key %d", k)
				}
				found++
			}
			close(stop)
			require.NoError(t, <-writerDone)
			t.Logf("%d lookups, %d found the key, %d rows written", i, found, written.Load())
		})
	}
}

// TestLookupLinearizable: writers insert and delete keys of their own in a unique index of
// small rows (3 entries of 16-byte keys: buckets split, overflow rows come and go, deletes
// move entries into holes), each key's state published around every operation (odd while
// one is in flight); readers Lookup keys and, when no operation on the key overlapped the
// Lookup, require exactly the state the last one left: its id, or ErrNotFound.
func TestLookupLinearizable(t *testing.T) {
	ctx := context.Background()
	ops, writers, keysEach := 3000, 2, 40
	if testing.Short() {
		ops = 400
	}
	db := openDB(t, t.TempDir())
	defer db.Close(ctx)
	ix := createIndex(t, ctx, db, "a", hashindex.Options{KeyBytes: 16, Unique: true, RowBytes: 96})
	n := writers * keysEach
	// seq[k] is 2g once key k's g-th operation returned, odd while one is in flight; after
	// g operations the key is present with id k<<32|g when g is odd, absent when g is even.
	seq := make([]atomic.Uint64, n)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 5))
			gen := make([]uint64, keysEach)
			for range ops {
				j := r.IntN(keysEach)
				k := w*keysEach + j
				seq[k].Add(1) // odd: in flight
				var err error
				if gen[j]%2 == 0 {
					err = ix.Insert(ctx, playerName(k), uint64(k)<<32|(gen[j]+1))
				} else {
					err = ix.Delete(ctx, playerName(k), uint64(k)<<32|gen[j])
				}
				if err != nil {
					t.Errorf("writer %d: %v", w, err)
					stop.Store(true)
					return
				}
				gen[j]++
				seq[k].Add(1)
			}
		})
	}
	readerDone := make(chan error, 2)
	var checked atomic.Int64
	for rd := range 2 {
		go func() {
			r := rand.New(rand.NewPCG(uint64(rd), 9))
			for !stop.Load() {
				k := r.IntN(n)
				before := seq[k].Load()
				id, err := ix.Lookup(ctx, playerName(k))
				if after := seq[k].Load(); before != after || before%2 == 1 {
					continue
				}
				gen := before / 2
				switch {
				case gen%2 == 1 && (err != nil || id != uint64(k)<<32|gen):
					readerDone <- fmt.Errorf("key %d at generation %d (present): got %d, %v", k, gen, id, err)
					return
				case gen%2 == 0 && !errors.Is(err, hashindex.ErrNotFound):
					readerDone <- fmt.Errorf("key %d at generation %d (absent): got %d, %v", k, gen, id, err)
					return
				}
				checked.Add(1)
			}
			readerDone <- nil
		}()
	}
	wg.Wait()
	stop.Store(true)
	for range 2 {
		require.NoError(t, <-readerDone)
	}
	st := verifyIndex(t, ctx, ix)
	t.Logf("%d lookups checked; %+v", checked.Load(), st)
}
