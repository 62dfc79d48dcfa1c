package hashindex_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/hashindex"
	"github.com/weftdb/weft/txnode"
)

// TestUniqueRaceNeverBothCommit: two transactions insert the same key into a unique index,
// each seeing it absent; OCC lets exactly one commit. Run with a bucket that has room and
// with one that is full (so both add an overflow row and split).
func TestUniqueRaceNeverBothCommit(t *testing.T) {
	ctx := context.Background()
	for _, fill := range []int{0, 2} {
		db := openDB(t, t.TempDir())
		defer db.Close(ctx)
		ix, err := hashindex.Create(ctx, db, "names", hashindex.Options{KeyBytes: 8, Unique: true, RowBytes: 64}) // 2 entries a row
		require.NoError(t, err)
		// One bucket: any keys share it; fill it to capacity first.
		for i := range fill {
			require.NoError(t, ix.Insert(ctx, key8(1000+i), uint64(i)))
		}
		for round := range 20 {
			k := key8(round)
			tx1, err := db.Begin(ctx, true)
			require.NoError(t, err)
			tx2, err := db.Begin(ctx, true)
			require.NoError(t, err)
			require.NoError(t, ix.TxInsert(tx1, k, 1))
			require.NoError(t, ix.TxInsert(tx2, k, 2))
			err1, err2 := tx1.Commit(), tx2.Commit()
			require.True(t, (err1 == nil) != (err2 == nil), "round %d: commits %v, %v", round, err1, err2)
			require.ErrorIs(t, errors.Join(err1, err2), txnode.ErrConflict)
			id, err := ix.Lookup(ctx, k)
			require.NoError(t, err)
			if err1 == nil {
				require.Equal(t, uint64(1), id)
			} else {
				require.Equal(t, uint64(2), id)
			}
		}
		verifyIndex(t, ctx, ix)
	}
}

// TestConcurrentInsertLookup: writers race to claim the same keys of a unique index (each
// key must end with exactly one winner, the others get ErrUniqueViolation) while the index
// grows from one bucket, and readers look up keys already claimed with the lock-free
// Lookup, which must always find the winner's id even while its bucket is split under it.
func TestConcurrentInsertLookup(t *testing.T) {
	for _, mode := range []txnode.Durability{txnode.Durable, txnode.WriteBack} {
		t.Run(map[txnode.Durability]string{txnode.Durable: "durable", txnode.WriteBack: "writeback"}[mode], func(t *testing.T) {
			concurrentInsertLookup(t, mode)
		})
	}
}

func concurrentInsertLookup(t *testing.T, mode txnode.Durability) {
	ctx := context.Background()
	keys, writers, readers := 3000, 4, 2
	if testing.Short() {
		keys, writers, readers = 600, 3, 2
	}
	db, err := txnode.Open(ctx, txnode.Options{Dir: t.TempDir(), SyncMode: "none", Durability: mode})
	require.NoError(t, err)
	defer db.Close(ctx)
	ix := createIndex(t, ctx, db, "names", hashindex.Options{KeyBytes: 8, Unique: true, RowBytes: 64})

	owner := make([]atomic.Int64, keys) // writer+1 that claimed key i
	var claimed atomic.Int64            // keys [0, claimed) have an owner... in order of a ticket
	var order []int
	var orderMu sync.Mutex
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			perm := r.Perm(keys)
			for _, k := range perm {
				err := ix.Insert(ctx, key8(k), uint64(w))
				switch {
				case err == nil:
					if !owner[k].CompareAndSwap(0, int64(w)+1) {
						t.Errorf("key %d: second winner %d", k, w)
						return
					}
					orderMu.Lock()
					order = append(order, k)
					claimed.Store(int64(len(order)))
					orderMu.Unlock()
				case errors.Is(err, hashindex.ErrUniqueViolation):
				default:
					t.Errorf("insert %d: %v", k, err)
					return
				}
			}
		}()
	}
	stop := make(chan struct{})
	var rg sync.WaitGroup
	for r := range readers {
		rg.Add(1)
		go func() {
			defer rg.Done()
			rnd := rand.New(rand.NewPCG(uint64(r), 9))
			for {
				select {
				case <-stop:
					return
				default:
				}
				n := claimed.Load()
				if n == 0 {
					continue
				}
				orderMu.Lock()
				k := order[rnd.IntN(int(n))]
				orderMu.Unlock()
				id, err := ix.Lookup(ctx, key8(k))
				if err != nil || int64(id)+1 != owner[k].Load() {
					t.Errorf("lookup %d: id %d, %v; owner %d", k, id, err, owner[k].Load()-1)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	rg.Wait()
	st := verifyIndex(t, ctx, ix)
	require.Equal(t, keys, st.Entries)
	for k := range keys {
		id, err := ix.Lookup(ctx, key8(k))
		require.NoError(t, err)
		require.Equal(t, owner[k].Load()-1, int64(id))
	}
	t.Logf("%+v", st)
}

// TestConcurrentMixed: writers insert and delete their own entries of a non-unique index
// whose keys they share (so their entries share buckets, and splits and overflow unlinks
// race), each keeping a model of its own entries; at the end the index holds exactly the
// union, and Verify passes.
func TestConcurrentMixed(t *testing.T) {
	ctx := context.Background()
	ops, writers := 1500, 4
	if testing.Short() {
		ops, writers = 300, 3
	}
	db := openDB(t, t.TempDir())
	defer db.Close(ctx)
	ix := createIndex(t, ctx, db, "kinds", hashindex.Options{KeyBytes: 8, RowBytes: 64})
	models := make([]map[[2]uint64]bool, writers)
	var wg sync.WaitGroup
	for w := range writers {
		models[w] = map[[2]uint64]bool{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 11))
			m := models[w]
			for range ops {
				k := uint64(r.IntN(200))
				id := uint64(w)<<32 | uint64(r.IntN(8)) // ids of writer w only
				var err error
				if m[[2]uint64{k, id}] {
					if err = ix.Delete(ctx, key8(int(k)), id); err == nil {
						delete(m, [2]uint64{k, id})
					}
				} else if err = ix.Insert(ctx, key8(int(k)), id); err == nil {
					m[[2]uint64{k, id}] = true
				}
				if err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	st, got, err := ix.EntriesForTest(ctx)
	require.NoError(t, err)
	want := map[string][]uint64{}
	n := 0
	for _, m := range models {
		for e := range m {
			want[string(key8(int(e[0])))] = append(want[string(key8(int(e[0])))], e[1])
			n++
		}
	}
	require.Equal(t, n, st.Entries)
	require.Len(t, got, len(want))
	for k, ids := range want {
		require.ElementsMatch(t, ids, got[k])
	}
	t.Logf("%+v", st)
}

// TestHotKeyGrowsNoBuckets: on a non-unique index a key with many ids (an item kind) fills
// a chain of its own; it does not make the index split buckets that would not help it.
func TestHotKeyGrowsNoBuckets(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, t.TempDir())
	defer db.Close(ctx)
	ix := createIndex(t, ctx, db, "kinds", hashindex.Options{KeyBytes: 4})
	sword := []byte("swrd")
	for lo := 0; lo < 2000; lo += 250 {
		require.NoError(t, db.Update(ctx, func(tx *txnode.Tx) error {
			for id := lo; id < lo+250; id++ {
				if err := ix.TxInsert(tx, sword, uint64(id)); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	for i := range 40 { // a few other kinds
		require.NoError(t, ix.Insert(ctx, []byte{'k', byte(i), 0, 0}, uint64(i)))
	}
	st := verifyIndex(t, ctx, ix)
	require.Equal(t, 2040, st.Entries)
	require.LessOrEqual(t, st.Buckets, 16, "%+v", st)
	var ids []uint64
	for id, err := range ix.IDs(ctx, sword) {
		require.NoError(t, err)
		ids = append(ids, id)
	}
	require.Len(t, ids, 2000)
	// Delete half: emptied overflow rows go.
	for id := 0; id < 2000; id += 2 {
		require.NoError(t, ix.Delete(ctx, sword, uint64(id)))
	}
	st2 := verifyIndex(t, ctx, ix)
	require.Equal(t, 1040, st2.Entries)
	t.Logf("after inserts %+v, after deletes %+v", st, st2)
}
