package txnode

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestZZScratch(t *testing.T) {
	ctx := context.Background()
	for _, c := range openConfigs(t) {
		t.Run(c.name, func(t *testing.T) {
			open := c.opener(t)
			db := open(Options{})
			tab, err := db.CreateTable(ctx, "items", 64)
			require.NoError(t, err)
			id, err := tab.Insert(ctx, make([]byte, 64))
			require.NoError(t, err)
			_, err = db.CreateTable(ctx, "items", 64)
			fmt.Println(c.name, "exists:", err)
			_, err = db.CreateTable(ctx, "bad name!", 64)
			fmt.Println(c.name, "badname:", err)
			_, err = db.CreateTable(ctx, "x", 63)
			fmt.Println(c.name, "rowsize:", err)
			_, err = db.Table(ctx, "nope")
			fmt.Println(c.name, "notfound:", err)
			fmt.Println(c.name, "drop nope:", db.DropTable(ctx, "nope"))
			fmt.Println(c.name, "get absent:", tab.Get(ctx, id+1, make([]byte, 64)))
			fmt.Println(c.name, "get far:", tab.Get(ctx, 1<<40, make([]byte, 64)))
			fmt.Println(c.name, "get far2:", tab.Get(ctx, 1<<35, make([]byte, 64)))
			for _, err := range tab.Scan(ctx, 0, 1<<40) {
				fmt.Println(c.name, "scan far:", err)
			}
			require.NoError(t, db.Close(ctx))
			ts, err := db.Tables(ctx)
			fmt.Println(c.name, "tables after close:", ts, err)
			fmt.Println(c.name, "get after close:", tab.Get(ctx, id, make([]byte, 64)))
			_, err = tab.Insert(ctx, make([]byte, 64))
			fmt.Println(c.name, "insert after close:", err)
			fmt.Println(c.name, "drop after close:", db.DropTable(ctx, "items"))
			_, err = db.Table(ctx, "items")
			fmt.Println(c.name, "table after close:", err)
			for _, err := range tab.Scan(ctx, 0, 100) {
				fmt.Println(c.name, "scan after close:", err)
			}
		})
	}
}
