package storenode

import (
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/internal/vfs"
)

// Out of file descriptors, a table's data file cannot be created: that CreateTable fails, the
// engine goes on. Fails on 767c454, which fail-stopped.
func TestCreateTableOutOfFiles(t *testing.T) {
	e, fs, info, g := openFault(t, Options{}, testOwner)
	fs.Inject(func(op vfs.Op) error {
		if op.Kind == vfs.OpCreate && strings.Contains(op.Name, "table-") {
			return syscall.EMFILE
		}
		return nil
	})
	_, err := e.CreateTable("more", 64)
	require.ErrorIs(t, err, ErrTooManyTables)
	require.ErrorIs(t, err, syscall.EMFILE)
	fs.Inject(nil)
	_, err = e.CommitWait(batchOf(testOwner, 1, info.ID, g.Epoch, oneRow(info.ID, 1, row64(1))))
	require.NoError(t, err, "the engine goes on")
	_, err = e.CreateTable("more", 64)
	require.NoError(t, err)
	require.NoError(t, e.Checkpoint())
}

func TestMaxTables(t *testing.T) {
	e := openTest(t, Options{MaxTables: 2})
	_, err := e.CreateTable("a", 64)
	require.NoError(t, err)
	_, err = e.CreateTable("b", 64)
	require.NoError(t, err)
	_, err = e.CreateTable("c", 64)
	require.ErrorIs(t, err, ErrTooManyTables)
	require.NoError(t, e.DropTable("b", testOwner))
	_, err = e.CreateTable("c", 64)
	require.ErrorIs(t, err, ErrTooManyTables, "a dropped table's file stays open until a checkpoint")
	require.NoError(t, e.Checkpoint())
	_, err = e.CreateTable("c", 64)
	require.NoError(t, err)
}

// TestMaxTablesPerOwner: CreateTableAs counts the tables an owner holds (or last held) and
// those it created that nobody was granted yet; a table another owner acquires counts for
// that owner; dropped ones count until a checkpoint; CreateTable (an operator's) is not
// bounded per owner.
func TestMaxTablesPerOwner(t *testing.T) {
	const a, b = testOwner, testOwner + 1
	e := openTest(t, Options{MaxTables: 16, MaxTablesPerOwner: 2})
	_, err := e.CreateTableAs("a1", 64, a)
	require.NoError(t, err)
	a2, err := e.CreateTableAs("a2", 64, a)
	require.NoError(t, err)
	_, err = e.CreateTableAs("a3", 64, a)
	require.ErrorIs(t, err, ErrTooManyTables, "owner a's bound")
	_, err = e.CreateTableAs("b1", 64, b)
	require.NoError(t, err, "another owner's bound is its own")
	_, err = e.CreateTable("op", 64)
	require.NoError(t, err, "an operator's table is not an owner's")

	// b acquires a2: it counts for b now, not for a.
	acquire(t, e, a2.ID, b, 0)
	_, err = e.CreateTableAs("a3", 64, a)
	require.NoError(t, err)
	_, err = e.CreateTableAs("b2", 64, b)
	require.ErrorIs(t, err, ErrTooManyTables, "b holds a2 and created b1")

	require.NoError(t, e.DropTable("b1", b))
	_, err = e.CreateTableAs("b2", 64, b)
	require.ErrorIs(t, err, ErrTooManyTables, "a dropped table counts until a checkpoint")
	require.NoError(t, e.Checkpoint())
	_, err = e.CreateTableAs("b2", 64, b)
	require.NoError(t, err)
}
