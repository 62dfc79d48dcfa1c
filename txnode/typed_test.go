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
