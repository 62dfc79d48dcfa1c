package txnode_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"math"
	"os"

	"github.com/weftdb/weft/txnode"
)

// Item is a game item: 64 bytes on disk, fields little-endian at fixed offsets.
//
//	 0 Kind        uint32
//	 4 Flags       uint32
//	 8 Owner       uint64   (0: on the ground)
//	16 X, Y, Z     float32 ×3
//	28 Durability  uint16
//	30 Stack       uint16
//	32 Template    uint64
//	40 Expires     int64    (unix seconds, 0: never)
//	48 reserved    16 bytes, zero
type Item struct {
	Kind       uint32
	Flags      uint32
	Owner      uint64
	X, Y, Z    float32
	Durability uint16
	Stack      uint16
	Template   uint64
	Expires    int64
}

// ItemCodec is Item's hand-written txnode.RowCodec.
type ItemCodec struct{}

// ItemBytes is an Item's row size.
const ItemBytes = 64

func (ItemCodec) RowBytes() int { return ItemBytes }

func (ItemCodec) MarshalRow(dst []byte, v *Item) {
	le := binary.LittleEndian
	dst = dst[:ItemBytes]
	le.PutUint32(dst[0:], v.Kind)
	le.PutUint32(dst[4:], v.Flags)
	le.PutUint64(dst[8:], v.Owner)
	le.PutUint32(dst[16:], math.Float32bits(v.X))
	le.PutUint32(dst[20:], math.Float32bits(v.Y))
	le.PutUint32(dst[24:], math.Float32bits(v.Z))
	le.PutUint16(dst[28:], v.Durability)
	le.PutUint16(dst[30:], v.Stack)
	le.PutUint64(dst[32:], v.Template)
	le.PutUint64(dst[40:], uint64(v.Expires))
	clear(dst[48:])
}

func (ItemCodec) UnmarshalRow(src []byte, v *Item) {
	le := binary.LittleEndian
	src = src[:ItemBytes]
	*v = Item{
		Kind:       le.Uint32(src[0:]),
		Flags:      le.Uint32(src[4:]),
		Owner:      le.Uint64(src[8:]),
		X:          math.Float32frombits(le.Uint32(src[16:])),
		Y:          math.Float32frombits(le.Uint32(src[20:])),
		Z:          math.Float32frombits(le.Uint32(src[24:])),
		Durability: le.Uint16(src[28:]),
		Stack:      le.Uint16(src[30:]),
		Template:   le.Uint64(src[32:]),
		Expires:    int64(le.Uint64(src[40:])),
	}
}

// openExample opens an embedded node in a fresh directory; removeDir removes the directory.
// Every example then defers db.Close(ctx), as a game server must: in WriteBack mode a
// missing Close loses the commits not yet flushed (Options.Durability).
func openExample() (db *txnode.DB, removeDir func()) {
	dir, err := os.MkdirTemp("", "weft-example-")
	if err != nil {
		log.Fatal(err)
	}
	db, err = txnode.Open(context.Background(), txnode.Options{Dir: dir})
	if err != nil {
		log.Fatal(err)
	}
	return db, func() { os.RemoveAll(dir) }
}

func ExampleDB_Update() {
	ctx := context.Background()
	db, removeDir := openExample()
	defer removeDir()
	defer db.Close(ctx)

	// Accounts: a balance in the first 8 bytes of a 64-byte row.
	accounts, err := db.CreateTable(ctx, "accounts", 64)
	if err != nil {
		log.Fatal(err)
	}
	row := make([]byte, 64)
	binary.LittleEndian.PutUint64(row, 100)
	alice, _ := accounts.Insert(ctx, row)
	bob, _ := accounts.Insert(ctx, row)

	// Move 30 from alice to bob, atomically. The closure may run more than once (on a
	// conflict it is retried), so it only touches the transaction.
	errFunds := errors.New("insufficient funds")
	transfer := func(from, to uint64, amount uint64) error {
		return db.Update(ctx, func(tx *txnode.Tx) error {
			a, b := make([]byte, 64), make([]byte, 64)
			if err := tx.Get(accounts, from, a); err != nil {
				return err
			}
			if err := tx.Get(accounts, to, b); err != nil {
				return err
			}
			if binary.LittleEndian.Uint64(a) < amount {
				return errFunds // rolls the transaction back
			}
			binary.LittleEndian.PutUint64(a, binary.LittleEndian.Uint64(a)-amount)
			binary.LittleEndian.PutUint64(b, binary.LittleEndian.Uint64(b)+amount)
			if err := tx.Put(accounts, from, a); err != nil {
				return err
			}
			return tx.Put(accounts, to, b)
		})
	}
	fmt.Println(transfer(alice, bob, 30))
	fmt.Println(transfer(alice, bob, 500))

	for _, id := range []uint64{alice, bob} {
		if err := accounts.Get(ctx, id, row); err != nil {
			log.Fatal(err)
		}
		fmt.Println(binary.LittleEndian.Uint64(row))
	}
	// Output:
	// <nil>
	// insufficient funds
	// 70
	// 130
}

func ExampleTable_Get() {
	ctx := context.Background()
	db, removeDir := openExample()
	defer removeDir()
	defer db.Close(ctx)

	players, err := db.CreateTable(ctx, "players", 64)
	if err != nil {
		log.Fatal(err)
	}
	row := make([]byte, 64)
	copy(row, "ada")
	id, err := players.Insert(ctx, row)
	if err != nil {
		log.Fatal(err)
	}

	// Get copies the row into a buffer of the row size: served from the cache, it takes no
	// lock and allocates nothing.
	got := make([]byte, players.RowBytes())
	if err := players.Get(ctx, id, got); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s\n", got[:3])

	if err := players.Delete(ctx, id); err != nil {
		log.Fatal(err)
	}
	err = players.Get(ctx, id, got)
	fmt.Println(errors.Is(err, txnode.ErrNotFound))
	// Output:
	// ada
	// true
}

func ExampleSession_Go() {
	ctx := context.Background()
	db, removeDir := openExample()
	defer removeDir()
	defer db.Close(ctx)

	events, err := db.CreateTable(ctx, "events", 64)
	if err != nil {
		log.Fatal(err)
	}

	// One game tick: many transactions in flight from one goroutine. Each is visible to
	// later transactions at once; Flush waits until all of them are durable.
	s := db.Session()
	var last *txnode.Pending
	for i := range 1000 {
		last = s.Go(ctx, func(tx *txnode.Tx) error {
			row := make([]byte, 64)
			binary.LittleEndian.PutUint64(row, uint64(i))
			_, err := tx.Insert(events, row)
			return err
		})
	}
	if err := s.Flush(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println(last.Wait(ctx)) // resolved: earlier pendings resolve first

	n := 0
	for _, err := range events.Scan(ctx, 0, math.MaxUint64) {
		if err != nil {
			log.Fatal(err)
		}
		n++
	}
	fmt.Println(n)
	// Output:
	// <nil>
	// 1000
}

func ExampleTyped() {
	ctx := context.Background()
	db, removeDir := openExample()
	defer removeDir()
	defer db.Close(ctx)

	table, err := db.CreateTable(ctx, "items", ItemBytes)
	if err != nil {
		log.Fatal(err)
	}
	items, err := txnode.Typed[Item](table, ItemCodec{})
	if err != nil {
		log.Fatal(err)
	}

	sword := Item{Kind: 7, X: 10.5, Y: 2, Durability: 100, Template: 4001}
	id, err := items.Insert(ctx, &sword)
	if err != nil {
		log.Fatal(err)
	}

	// A player picks it up and it wears a little, in one transaction.
	err = db.Update(ctx, func(tx *txnode.Tx) error {
		return items.TxUpdate(tx, id, func(it *Item) error {
			it.Owner = 42
			it.Durability -= 3
			return nil
		})
	})
	if err != nil {
		log.Fatal(err)
	}

	var got Item
	if err := items.Get(ctx, id, &got); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("kind %d owner %d durability %d at (%.1f, %.1f)\n", got.Kind, got.Owner, got.Durability, got.X, got.Y)
	// Output:
	// kind 7 owner 42 durability 97 at (10.5, 2.0)
}
