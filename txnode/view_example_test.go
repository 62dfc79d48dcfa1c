package txnode_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"log"

	"github.com/weftdb/weft/txnode"
)

// A guild roster: a 1 KiB row, a member count in its first 8 bytes, then 8-byte member ids.
// Finding one member needs a few words of it, not a copy of the whole row.
func ExampleTable_View() {
	ctx := context.Background()
	db, removeDir := openExample()
	defer removeDir()
	defer db.Close(ctx)

	guilds, err := db.CreateTable(ctx, "guilds", 1024)
	if err != nil {
		log.Fatal(err)
	}
	row := make([]byte, 1024)
	binary.LittleEndian.PutUint64(row, 3)
	for i, member := range []uint64{11, 42, 97} {
		binary.LittleEndian.PutUint64(row[8+8*i:], member)
	}
	id, err := guilds.Insert(ctx, row)
	if err != nil {
		log.Fatal(err)
	}

	// fn reads the row in the cache, in place. It may run more than once, each run
	// overwriting what the last one found; it bounds the count it reads from the row
	// before using it (a run that is thrown away may see a row being overwritten); and it
	// keeps nothing of row, which is valid only while fn runs.
	isMember := func(guild, player uint64) (bool, error) {
		found := false
		err := guilds.View(ctx, guild, func(row []byte) error {
			found = false
			n := min(binary.LittleEndian.Uint64(row), uint64(len(row)/8-1))
			for i := range n {
				if binary.LittleEndian.Uint64(row[8+8*i:]) == player {
					found = true
					break
				}
			}
			return nil
		})
		return found, err
	}
	fmt.Println(isMember(id, 42))
	fmt.Println(isMember(id, 43))

	// In a transaction, a View is part of what the transaction read: a commit that changes
	// the roster before this one commits makes it retry.
	err = db.Update(ctx, func(tx *txnode.Tx) error {
		var n uint64
		if err := tx.View(guilds, id, func(row []byte) error {
			n = binary.LittleEndian.Uint64(row)
			return nil
		}); err != nil {
			return err
		}
		fmt.Println("members:", n)
		return nil
	})
	fmt.Println(err)
	// Output:
	// true <nil>
	// false <nil>
	// members: 3
	// <nil>
}
