package hashindex_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/hashindex"
	"github.com/weftdb/weft/txnode"
	"pgregory.net/rapid"
)

// TestModel is a state machine against a Go map: Insert, Delete, Lookup, IDs, multi-step
// transactions (some rolled back), reopening the DB on its directory, and a full Verify
// after every step, over unique and non-unique indexes with tiny rows (one to four entries)
// so overflow chains and splits happen within a few steps. A failure prints a seed that
// replays (-rapid.seed).
func TestModel(t *testing.T) {
	ctx := context.Background()
	salt := uint64(0)
	hashindex.SetSaltForTest(t, func() uint64 { return salt })
	rapid.Check(t, func(rt *rapid.T) {
		salt = rapid.Uint64().Draw(rt, "salt")
		keyBytes := rapid.SampledFrom([]int{1, 3, 8, 16}).Draw(rt, "keyBytes")
		unique := rapid.Bool().Draw(rt, "unique")
		rowBytes := rapid.SampledFrom([]int{64, 64, 96}).Draw(rt, "rowBytes")
		buckets := rapid.SampledFrom([]int{0, 1, 3, 8}).Draw(rt, "buckets")
		opts := txnode.Options{SyncMode: "none"}
		if rapid.Bool().Draw(rt, "writeBack") {
			opts.Durability = txnode.WriteBack
		}
		dir, err := os.MkdirTemp("", "hashindex-model")
		require.NoError(rt, err)
		defer os.RemoveAll(dir)
		opts.Dir = dir
		db, err := txnode.Open(ctx, opts)
		require.NoError(rt, err)
		defer func() { db.Close(ctx) }()
		ix, err := hashindex.Create(ctx, db, "ix", hashindex.Options{KeyBytes: keyBytes, Unique: unique, RowBytes: rowBytes, Buckets: buckets})
		require.NoError(rt, err)

		model := map[string]map[uint64]bool{}
		keyOf := func(k int) []byte {
			b := make([]byte, keyBytes)
			for i := range b {
				b[i] = byte(k * (i + 1))
			}
			b[0] = byte(k)
			return b
		}
		keyGen := rapid.IntRange(0, 40)
		idGen := rapid.Uint64Range(0, 12)
		// apply runs one modelled operation on m, returning the error the index must give.
		apply := func(m map[string]map[uint64]bool, insert bool, k []byte, id uint64) error {
			ids := m[string(k)]
			if insert {
				switch {
				case unique && len(ids) > 0:
					return hashindex.ErrUniqueViolation
				case ids[id]:
					return hashindex.ErrEntryExists
				}
				if ids == nil {
					ids = map[uint64]bool{}
					m[string(k)] = ids
				}
				ids[id] = true
				return nil
			}
			if !ids[id] {
				return hashindex.ErrNotFound
			}
			delete(ids, id)
			if len(ids) == 0 {
				delete(m, string(k))
			}
			return nil
		}
		checkErr := func(want, got error) {
			if want == nil {
				require.NoError(rt, got)
			} else {
				require.ErrorIs(rt, got, want)
			}
		}
		clone := func(m map[string]map[uint64]bool) map[string]map[uint64]bool {
			c := map[string]map[uint64]bool{}
			for k, ids := range m {
				c[k] = maps.Clone(ids)
			}
			return c
		}

		rt.Repeat(map[string]func(*rapid.T){
			"insert": func(rt *rapid.T) {
				k, id := keyOf(keyGen.Draw(rt, "key")), idGen.Draw(rt, "id")
				checkErr(apply(model, true, k, id), ix.Insert(ctx, k, id))
			},
			"grow": func(rt *rapid.T) { // many keys, beyond the small pool: splits
				for range 25 {
					k, id := keyOf(rapid.IntRange(0, 255).Draw(rt, "key")), idGen.Draw(rt, "id")
					checkErr(apply(model, true, k, id), ix.Insert(ctx, k, id))
				}
			},
			"delete": func(rt *rapid.T) {
				k, id := keyOf(keyGen.Draw(rt, "key")), idGen.Draw(rt, "id")
				checkErr(apply(model, false, k, id), ix.Delete(ctx, k, id))
			},
			"lookup": func(rt *rapid.T) {
				k := keyOf(keyGen.Draw(rt, "key"))
				want := model[string(k)]
				id, err := ix.Lookup(ctx, k)
				var txID uint64
				txErr := db.View(ctx, func(tx *txnode.Tx) error {
					var err error
					txID, err = ix.TxLookup(tx, k)
					return err
				})
				if len(want) == 0 {
					require.ErrorIs(rt, err, hashindex.ErrNotFound)
					require.ErrorIs(rt, txErr, hashindex.ErrNotFound)
					return
				}
				require.NoError(rt, err)
				require.NoError(rt, txErr)
				require.True(rt, want[id] && want[txID], "ids %d, %d of %v", id, txID, want)
				var got []uint64
				for id, err := range ix.IDs(ctx, k) {
					require.NoError(rt, err)
					got = append(got, id)
				}
				slices.Sort(got)
				require.Equal(rt, slices.Sorted(maps.Keys(want)), got)
			},
			"tx": func(rt *rapid.T) {
				ops := rapid.IntRange(1, 6).Draw(rt, "ops")
				rollback := rapid.Bool().Draw(rt, "rollback")
				type op struct {
					insert bool
					k      []byte
					id     uint64
				}
				var plan []op
				for range ops {
					plan = append(plan, op{rapid.Bool().Draw(rt, "insert"), keyOf(keyGen.Draw(rt, "key")), idGen.Draw(rt, "id")})
				}
				errRollback := errors.New("roll back")
				var after map[string]map[uint64]bool
				err := db.Update(ctx, func(tx *txnode.Tx) error {
					after = clone(model)
					for _, o := range plan {
						want := apply(after, o.insert, o.k, o.id)
						var got error
						if o.insert {
							got = ix.TxInsert(tx, o.k, o.id)
						} else {
							got = ix.TxDelete(tx, o.k, o.id)
						}
						if !errors.Is(got, want) && !(want == nil && got == nil) {
							return errors.Join(errors.New("in-tx result differs from the model"), want, got)
						}
						// The transaction sees its own writes.
						_, lerr := ix.TxLookup(tx, o.k)
						if (len(after[string(o.k)]) == 0) != errors.Is(lerr, hashindex.ErrNotFound) {
							return errors.Join(errors.New("in-tx lookup differs from the model"), lerr)
						}
					}
					if rollback {
						return errRollback
					}
					return nil
				})
				if rollback {
					require.ErrorIs(rt, err, errRollback)
					return
				}
				require.NoError(rt, err)
				model = after
			},
			"reopen": func(rt *rapid.T) {
				require.NoError(rt, db.Close(ctx))
				db, err = txnode.Open(ctx, opts)
				require.NoError(rt, err)
				ix, err = hashindex.Open(ctx, db, "ix")
				require.NoError(rt, err)
				require.Equal(rt, keyBytes, ix.KeyBytes())
				require.Equal(rt, unique, ix.Unique())
			},
			"": func(rt *rapid.T) {
				_, got, err := ix.EntriesForTest(ctx)
				require.NoError(rt, err)
				require.Equal(rt, len(model), len(got))
				for k, ids := range model {
					g := slices.Clone(got[k])
					slices.Sort(g)
					require.Equal(rt, slices.Sorted(maps.Keys(ids)), g)
				}
			},
		})
	})
}
