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

// A reader that checks a row's checksum once per version: the version it last verified is
// remembered, and a run that sees that version again trusts the row without checking it.
// Any row written since (a Put of the same bytes too) has another version and is checked
// again. The remembered version is stored only once ViewVersion returned nil: a run that
// was thrown away may have seen a row being overwritten.
func ExampleTable_ViewVersion() {
	ctx := context.Background()
	db, removeDir := openExample()
	defer removeDir()
	defer db.Close(ctx)

	scores, err := db.CreateTable(ctx, "scores", 64)
	if err != nil {
		log.Fatal(err)
	}
	// A row: a score in bytes 0-7, its checksum (a toy one) in bytes 8-15.
	mk := func(score uint64) []byte {
		row := make([]byte, 64)
		binary.LittleEndian.PutUint64(row, score)
		binary.LittleEndian.PutUint64(row[8:], score*0x9E3779B97F4A7C15)
		return row
	}
	id, err := scores.Insert(ctx, mk(7))
	if err != nil {
		log.Fatal(err)
	}

	// verified is ^ the version last checked, 0 for none (^v is never 0: a version is
	// below 2^63).
	var verified uint64
	checks := 0
	read := func() (uint64, error) {
		var score, memo uint64
		err := scores.ViewVersion(ctx, id, func(row []byte, version uint64) error {
			score, memo = binary.LittleEndian.Uint64(row), 0
			if ^version != verified {
				if binary.LittleEndian.Uint64(row[8:]) != score*0x9E3779B97F4A7C15 {
					return fmt.Errorf("row %d: bad checksum", id)
				}
				memo = ^version // recorded below, once this run is the one that counts
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
		if memo != 0 {
			verified = memo
			checks++
		}
		return score, nil
	}
	for range 3 {
		fmt.Println(read())
	}
	fmt.Println("checks:", checks)
	if err := scores.Put(ctx, id, mk(9)); err != nil {
		log.Fatal(err)
	}
	fmt.Println(read())
	fmt.Println("checks:", checks)
	// Output:
	// 7 <nil>
	// 7 <nil>
	// 7 <nil>
	// checks: 1
	// 9 <nil>
	// checks: 2
}
