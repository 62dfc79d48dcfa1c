package txnode_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/txnode"
)

// Typed rows: the Item codec of example_test.go, and TypedTable over every configuration.

func TestItemCodec(t *testing.T) {
	var codec txnode.RowCodec[Item] = ItemCodec{}
	require.Equal(t, ItemBytes, codec.RowBytes())
	for _, it := range []Item{
		{},
		{Kind: 1, Flags: 0x8000_0001, Owner: 42, X: -1.5, Y: 0, Z: 1e30, Durability: 100, Stack: 20, Template: 7, Expires: -1},
		{Kind: math.MaxUint32, Flags: math.MaxUint32, Owner: math.MaxUint64, X: float32(math.Inf(1)), Y: float32(math.Inf(-1)),
			Z: math.SmallestNonzeroFloat32, Durability: math.MaxUint16, Stack: math.MaxUint16, Template: math.MaxUint64, Expires: math.MinInt64},
	} {
		row := make([]byte, ItemBytes)
		for i := range row {
			row[i] = 0xAA // MarshalRow writes every byte, reserved ones as zero
		}
		codec.MarshalRow(row, &it)
		require.Equal(t, make([]byte, 16), row[48:], "reserved bytes")
		var got Item
		codec.UnmarshalRow(row, &got)
		require.Equal(t, it, got)
	}
	// NaN does not equal itself: compare its bits.
	row := make([]byte, ItemBytes)
	codec.MarshalRow(row, &Item{X: float32(math.NaN())})
	var got Item
	codec.UnmarshalRow(row, &got)
	require.True(t, math.IsNaN(float64(got.X)))
}

func TestTypedTable(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range txnode.ConfigsForTest(t) {
		t.Run(cfg.Name, func(t *testing.T) {
			open := cfg.Opener(t)
			db := open(txnode.Options{})
			small, err := db.CreateTable(ctx, "small", 32)
			require.NoError(t, err)
			_, err = txnode.Typed[Item](small, ItemCodec{})
			require.ErrorIs(t, err, txnode.ErrRowSize)

			table, err := db.CreateTable(ctx, "items", ItemBytes)
			require.NoError(t, err)
			items, err := txnode.Typed[Item](table, ItemCodec{})
			require.NoError(t, err)
			require.Same(t, table, items.Table())

			want := map[uint64]Item{}
			for i := range 200 {
				it := Item{Kind: uint32(i % 7), Owner: uint64(i), X: float32(i) / 2, Durability: 100, Template: uint64(1000 + i)}
				id, err := items.Insert(ctx, &it)
				require.NoError(t, err)
				want[id] = it
			}
			var ids []uint64
			for id := range want {
				ids = append(ids, id)
			}

			// Put, Delete, and transactions of typed calls.
			it := want[ids[0]]
			it.Stack = 9
			require.NoError(t, items.Put(ctx, ids[0], &it))
			want[ids[0]] = it
			require.NoError(t, items.Delete(ctx, ids[1]))
			delete(want, ids[1])
			var got Item
			require.ErrorIs(t, items.Get(ctx, ids[1], &got), txnode.ErrNotFound)
			require.ErrorIs(t, items.Put(ctx, ids[1], &it), txnode.ErrNotFound)

			var created uint64
			require.NoError(t, db.Update(ctx, func(tx *txnode.Tx) error {
				var a Item
				if err := items.TxGet(tx, ids[2], &a); err != nil {
					return err
				}
				a.Owner, a.Flags = 0, 1 // dropped on the ground ...
				if err := items.TxPut(tx, ids[2], &a); err != nil {
					return err
				}
				ground := a // ... as a new item; the old one is gone
				ground.Flags = 2
				var err error
				if created, err = items.TxInsert(tx, &ground); err != nil {
					return err
				}
				return items.TxUpdate(tx, ids[3], func(v *Item) error { v.Durability--; return nil })
			}))
			a := want[ids[2]]
			a.Owner, a.Flags = 0, 1
			want[ids[2]] = a
			a.Flags = 2
			want[created] = a
			b := want[ids[3]]
			b.Durability--
			want[ids[3]] = b

			// A closure error in TxUpdate rolls the whole transaction back.
			errBroken := errors.New("item broken")
			err = db.Update(ctx, func(tx *txnode.Tx) error {
				if err := items.TxUpdate(tx, ids[4], func(v *Item) error { v.Durability = 0; return nil }); err != nil {
					return err
				}
				return items.TxUpdate(tx, ids[5], func(v *Item) error { return errBroken })
			})
			require.ErrorIs(t, err, errBroken)

			// Concurrent wear: every goroutine takes one point of durability off every item.
			const workers = 8
			var wg sync.WaitGroup
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for _, id := range ids[6:40] {
						err := db.Update(ctx, func(tx *txnode.Tx) error {
							return items.TxUpdate(tx, id, func(v *Item) error { v.Durability--; return nil })
						})
						if err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			for _, id := range ids[6:40] {
				v := want[id]
				v.Durability -= workers
				want[id] = v
			}

			check := func(items *txnode.TypedTable[Item]) {
				for id, w := range want {
					var got Item
					require.NoError(t, items.Get(ctx, id, &got))
					require.Equal(t, w, got, "item %d", id)
				}
			}
			check(items)
			require.NoError(t, db.Close(ctx))
			db = open(txnode.Options{})
			table, err = db.Table(ctx, "items")
			require.NoError(t, err)
			items, err = txnode.Typed[Item](table, ItemCodec{})
			require.NoError(t, err)
			check(items)
		})
	}
}

// TestTypedScanAndUpdate covers the typed scans (Scan, ScanAll and their Tx forms, which see
// the transaction's own writes and catch phantoms) and the non-transactional Update.
func TestTypedScanAndUpdate(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range txnode.ConfigsForTest(t) {
		t.Run(cfg.Name, func(t *testing.T) {
			db := cfg.Opener(t)(txnode.Options{})
			table, err := db.CreateTable(ctx, "items", ItemBytes)
			require.NoError(t, err)
			items, err := txnode.Typed[Item](table, ItemCodec{})
			require.NoError(t, err)

			// An empty table scans to nothing, in every form.
			for range items.ScanAll(ctx) {
				t.Fatal("row in an empty table")
			}
			for range table.ScanAll(ctx) {
				t.Fatal("row in an empty table")
			}

			want := map[uint64]Item{}
			var ids []uint64
			for i := range 300 { // several pages
				it := Item{Kind: uint32(i % 5), Owner: uint64(i), Durability: 50, Template: uint64(i) << 40}
				id, err := items.Insert(ctx, &it)
				require.NoError(t, err)
				want[id] = it
				ids = append(ids, id)
			}
			for i := 10; i < 200; i += 7 {
				require.NoError(t, items.Delete(ctx, ids[i]))
				delete(want, ids[i])
			}
			collect := func(seq func(func(txnode.TypedRow[Item], error) bool)) map[uint64]Item {
				got := map[uint64]Item{}
				last := uint64(0)
				for r, err := range seq {
					require.NoError(t, err)
					require.True(t, len(got) == 0 || r.ID > last, "id order")
					last = r.ID
					got[r.ID] = r.Value
				}
				return got
			}
			require.Equal(t, want, collect(items.ScanAll(ctx)))
			raw := 0
			for r, err := range table.ScanAll(ctx) {
				require.NoError(t, err)
				var it Item
				ItemCodec{}.UnmarshalRow(r.Data, &it)
				require.Equal(t, want[r.ID], it)
				raw++
			}
			require.Equal(t, len(want), raw)

			// A range, and an early break.
			lo, hi := ids[50], ids[120]
			inRange := map[uint64]Item{}
			for id, it := range want {
				if id >= lo && id < hi {
					inRange[id] = it
				}
			}
			require.Equal(t, inRange, collect(items.Scan(ctx, lo, hi)))
			n := 0
			for _, err := range items.ScanAll(ctx) {
				require.NoError(t, err)
				if n++; n == 3 {
					break
				}
			}
			require.Equal(t, 3, n)

			// The non-transactional Update: concurrent wear on every item, no lost update.
			const workers = 4
			wearIDs := ids[200:230]
			var wg sync.WaitGroup
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for _, id := range wearIDs {
						if err := items.Update(ctx, id, func(v *Item) error { v.Durability--; return nil }); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			for _, id := range wearIDs {
				it := want[id]
				it.Durability -= workers
				want[id] = it
			}
			errBroken := errors.New("item broken")
			require.ErrorIs(t, items.Update(ctx, ids[231], func(v *Item) error { v.Stack = 99; return errBroken }), errBroken)
			require.ErrorIs(t, items.Update(ctx, ids[10], func(v *Item) error { return nil }), txnode.ErrNotFound)
			require.Equal(t, want, collect(items.ScanAll(ctx)), "Update wrote what fn left, nothing on error")

			// TxScanAll sees the transaction's own writes.
			var added uint64
			require.NoError(t, db.Update(ctx, func(tx *txnode.Tx) error {
				it := Item{Kind: 77}
				var err error
				if added, err = items.TxInsert(tx, &it); err != nil {
					return err
				}
				if err := items.TxUpdate(tx, ids[0], func(v *Item) error { v.Stack = 5; return nil }); err != nil {
					return err
				}
				got := map[uint64]Item{}
				for r, err := range items.TxScanAll(tx) {
					if err != nil {
						return err
					}
					got[r.ID] = r.Value
				}
				if got[added].Kind != 77 || got[ids[0]].Stack != 5 || len(got) != len(want)+1 {
					return errors.New("TxScanAll missed the transaction's own writes")
				}
				inRange := 0
				for _, err := range items.TxScan(tx, ids[0], ids[1]) {
					if err != nil {
						return err
					}
					inRange++
				}
				if inRange != 1 {
					return errors.New("TxScan range")
				}
				return nil
			}))
			want[added] = Item{Kind: 77}
			it := want[ids[0]]
			it.Stack = 5
			want[ids[0]] = it

			// A phantom: an insert committed after a TxScanAll fails the scanner's commit.
			tx, err := db.Begin(ctx, true)
			require.NoError(t, err)
			require.Equal(t, len(want), len(collect(items.TxScanAll(tx))))
			require.NoError(t, items.TxPut(tx, ids[1], &Item{Kind: 1}))
			_, err = items.Insert(ctx, &Item{Kind: 2})
			require.NoError(t, err)
			require.ErrorIs(t, tx.Commit(), txnode.ErrConflict)

			// After Close the error ends the sequence as its only element.
			require.NoError(t, db.Close(ctx))
			var errs []error
			for r, err := range items.ScanAll(ctx) {
				require.Zero(t, r.ID)
				errs = append(errs, err)
			}
			require.Len(t, errs, 1)
			require.ErrorIs(t, errs[0], txnode.ErrClosed)
			require.ErrorIs(t, items.Update(ctx, ids[0], func(*Item) error { return nil }), txnode.ErrClosed)
		})
	}
}
