package hashindex_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/weftdb/weft/hashindex"
	"github.com/weftdb/weft/txnode"
)

// A players table with a unique name index, kept in the same transactions as the rows.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "weft-example")
	defer os.RemoveAll(dir)
	db, err := txnode.Open(ctx, txnode.Options{Dir: dir})
	if err != nil {
		panic(err)
	}
	defer db.Close(ctx)
	players, err := db.CreateTable(ctx, "players", 64)
	if err != nil {
		panic(err)
	}
	names, err := hashindex.Create(ctx, db, "players.name", hashindex.Options{KeyBytes: 16, Unique: true})
	if err != nil {
		panic(err)
	}
	name := func(s string) []byte {
		k, err := names.Key(s) // zero-padded to the key size; a longer name is ErrKeySize
		if err != nil {
			panic(err)
		}
		return k
	}

	register := func(player string) (uint64, error) {
		var id uint64
		err := db.Update(ctx, func(tx *txnode.Tx) error {
			row := make([]byte, 64)
			copy(row, player)
			var err error
			if id, err = tx.Insert(players, row); err != nil {
				return err
			}
			return names.TxInsert(tx, name(player), id) // the row and its name commit together
		})
		return id, err
	}
	id, err := register("alice")
	fmt.Println(err)
	_, err = register("alice")
	fmt.Println(errors.Is(err, hashindex.ErrUniqueViolation))

	found, err := names.Lookup(ctx, name("alice"))
	fmt.Println(found == id, err)
	_, err = names.Lookup(ctx, name("bob"))
	fmt.Println(err)
	// Output:
	// <nil>
	// true
	// true <nil>
	// hashindex: key not found
}
