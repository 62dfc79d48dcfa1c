package txnode_test

// The examples behind docs/getting-started.md: every code block of the guide is a run of
// lines of this file (TestGuideSnippetsCompile checks it), so the guide's code compiles and
// its printed output is checked.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
	"github.com/weftdb/weft/txnode"
)

// Example_gettingStarted is the guide's first program: open the embedded store, make a table,
// write and read rows.
func Example_gettingStarted() {
	dir, _ := os.MkdirTemp("", "weft-guide-")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	db, err := txnode.Open(ctx, txnode.Options{Dir: dir}) // the embedded store: no server
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close(ctx) // always: it flushes, waits, and releases the tables

	players, err := db.Table(ctx, "players") // made by an earlier run?
	if errors.Is(err, txnode.ErrTableNotFound) {
		players, err = db.CreateTable(ctx, "players", 64) // 64-byte rows
	}
	if err != nil {
		log.Fatal(err)
	}

	row := make([]byte, players.RowBytes())
	binary.LittleEndian.PutUint32(row[0:], 1200) // gold
	copy(row[8:], "ada")
	id, err := players.Insert(ctx, row) // ids are never reused
	if err != nil {
		log.Fatal(err)
	}

	err = players.Update(ctx, id, func(r []byte) error { // read-modify-write, one row
		gold := binary.LittleEndian.Uint32(r[0:])
		binary.LittleEndian.PutUint32(r[0:], gold+300)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}

	got := make([]byte, players.RowBytes())
	if err := players.Get(ctx, id, got); err != nil { // a cache hit: no syscall, no allocation
		log.Fatal(err)
	}
	fmt.Println("gold", binary.LittleEndian.Uint32(got[0:]))
	// Output: gold 1500
}

// Player is the guide's typed row: a game's struct, stored in a 64-byte row by PlayerCodec.
type Player struct {
	Gold  uint64
	Level uint32
	Name  string // at most 16 bytes
}

// PlayerCodec lays a Player out at fixed offsets, little-endian:
// 0 gold (u64), 8 level (u32), 12 name length (u8), 16 name (16 bytes), the rest zero.
type PlayerCodec struct{}

func (PlayerCodec) RowBytes() int { return 64 }

func (PlayerCodec) MarshalRow(dst []byte, p *Player) {
	clear(dst[:64]) // every byte of the row is written
	binary.LittleEndian.PutUint64(dst[0:], p.Gold)
	binary.LittleEndian.PutUint32(dst[8:], p.Level)
	dst[12] = byte(copy(dst[16:32], p.Name)) // a longer name is cut to 16 bytes
}

func (PlayerCodec) UnmarshalRow(src []byte, p *Player) {
	p.Gold = binary.LittleEndian.Uint64(src[0:])
	p.Level = binary.LittleEndian.Uint32(src[8:])
	p.Name = string(src[16 : 16+min(int(src[12]), 16)])
}

// Example_typedRows wraps a table with a RowCodec: rows go in and out as the game's struct.
func Example_typedRows() {
	dir, _ := os.MkdirTemp("", "weft-guide-")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	db, err := txnode.Open(ctx, txnode.Options{Dir: dir})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close(ctx)
	table, err := db.CreateTable(ctx, "players", 64)
	if err != nil {
		log.Fatal(err)
	}

	players, err := txnode.Typed[Player](table, PlayerCodec{}) // the codec's size must be the table's
	if err != nil {
		log.Fatal(err)
	}
	id, err := players.Insert(ctx, &Player{Gold: 1200, Level: 3, Name: "ada"})
	if err != nil {
		log.Fatal(err)
	}
	err = players.Update(ctx, id, func(p *Player) error { p.Level++; return nil })
	if err != nil {
		log.Fatal(err)
	}
	var p Player
	if err := players.Get(ctx, id, &p); err != nil {
		log.Fatal(err)
	}
	fmt.Println(p.Name, p.Level, p.Gold)
	// Output: ada 4 1200
}

// Example_transactions shows a serializable multi-row transaction, its error handling, and a
// scan of a whole table.
func Example_transactions() {
	db, removeDir := openExample()
	defer removeDir()
	ctx := context.Background()
	defer db.Close(ctx)
	wallets, _ := db.CreateTable(ctx, "wallets", 64)
	gold := func(n uint64) []byte {
		r := make([]byte, 64)
		binary.LittleEndian.PutUint64(r, n)
		return r
	}
	alice, _ := wallets.Insert(ctx, gold(100))
	bob, _ := wallets.Insert(ctx, gold(20))

	errPoor := errors.New("not enough gold")
	pay := func(from, to, amount uint64) error {
		return db.Update(ctx, func(tx *txnode.Tx) error { // may run more than once
			a, b := make([]byte, 64), make([]byte, 64)
			if err := tx.Get(wallets, from, a); err != nil {
				return err
			}
			if err := tx.Get(wallets, to, b); err != nil {
				return err
			}
			have := binary.LittleEndian.Uint64(a)
			if have < amount {
				return errPoor // rolls back; returned once what it read is durable
			}
			binary.LittleEndian.PutUint64(a, have-amount)
			binary.LittleEndian.PutUint64(b, binary.LittleEndian.Uint64(b)+amount)
			if err := tx.Put(wallets, from, a); err != nil {
				return err
			}
			return tx.Put(wallets, to, b)
		})
	}
	fmt.Println(pay(alice, bob, 70))
	fmt.Println(pay(alice, bob, 70))

	var total uint64
	for r, err := range wallets.ScanAll(ctx) { // every row, in id order
		if err != nil {
			log.Fatal(err)
		}
		total += binary.LittleEndian.Uint64(r.Data) // r.Data is valid until the next row
	}
	fmt.Println("total", total)
	// Output:
	// <nil>
	// not enough gold
	// total 120
}

// Example_errors shows what to do with the errors a game server meets.
func Example_errors() {
	db, removeDir := openExample()
	defer removeDir()
	ctx := context.Background()
	defer db.Close(ctx)
	loot, _ := db.CreateTable(ctx, "loot", 64)

	save := func(id uint64, row []byte) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		err := loot.Put(ctx, id, row)
		switch {
		case err == nil:
			return nil // committed (and durable, in Durable mode)
		case errors.Is(err, txnode.ErrUnknownOutcome):
			// The commit may or may not survive: a Put of the same bytes is idempotent, so
			// trying again (with a fresh deadline) is safe. A "+1" is not: read the row first.
			retry, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			return loot.Put(retry, id, row)
		case errors.Is(err, txnode.ErrConflict), errors.Is(err, txnode.ErrCacheFull):
			return err // nothing applied: back off, or shed load; the caller may retry
		default:
			return err // nothing applied (ErrNotFound, ErrRowSize, ctx.Err(), ...)
		}
	}
	fmt.Println(save(12345, make([]byte, 64)))              // no row 12345 yet: Put needs one
	fmt.Println(errors.Is(save(1, nil), txnode.ErrRowSize)) // rows are exactly the row size
	// Output:
	// txnode: row not found
	// true
}

// Example_storageNode runs the transaction node against a storage node over TCP (started in
// this process here; in production, cmd/storenode on its own machine or process).
func Example_storageNode() {
	dir, _ := os.MkdirTemp("", "weft-guide-node-")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	secret := []byte(sgio.GenerateSecret()) // what `storenode -gen-secret` prints
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", Secret: secret,
		Options: storenode.Options{Dir: dir}})
	if err != nil {
		log.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown(ctx)
	addr := srv.Addr().String()

	db, err := txnode.Open(ctx, txnode.Options{
		StoreAddr: addr,   // e.g. "127.0.0.1:7070"
		Secret:    secret, // the same text as the storage node's --secret-file
		OwnerID:   7,      // optional; one live node per id (a random one by default)
	})
	if err != nil {
		log.Fatal(err) // ErrOwnerInUse: another live node runs with OwnerID 7
	}
	defer db.Close(ctx) // releases the tables: the next node gets them without a lease wait

	zones, err := db.CreateTable(ctx, "zones", 128)
	if err != nil {
		log.Fatal(err)
	}
	id, _ := zones.Insert(ctx, make([]byte, 128))
	fmt.Println("zone", id, "stored at", "the storage node")
	// Output: zone 0 stored at the storage node
}
