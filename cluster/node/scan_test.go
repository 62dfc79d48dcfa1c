package node_test

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/txnode"
)

// A cluster table scans like a plain table (issue 23 item 4): every partition's rows in id
// order, this node's own partitions from its cache and the others' durable rows from their
// storage nodes, bounded by [lo, hi), stopped early on request.
func TestTableScanMergesPartitions(t *testing.T) {
	ctx := testCtx(t)
	tc, a, _, ta, tb, accts := bankSetup(t, 40)
	want := slices.Concat(accts[0], accts[1])
	slices.Sort(want)
	dst := make([]byte, 64)
	require.NoError(t, tb.Put(ctx, accts[1][3], balanceRow(777))) // b's, durable (Durable mode)
	require.NoError(t, ta.Get(ctx, accts[1][3], dst))

	scan := func(tbl *node.Table, lo, hi uint64) (ids []uint64, bal map[uint64]uint64) {
		bal = map[uint64]uint64{}
		for r, err := range tbl.Scan(ctx, lo, hi) {
			require.NoError(t, err)
			ids = append(ids, r.ID)
			bal[r.ID] = balanceOf(r.Data)
		}
		return ids, bal
	}
	for _, tbl := range []*node.Table{ta, tb} {
		ids, bal := scan(tbl, 0, ^uint64(0))
		require.Equal(t, want, ids, "every row, in id order, from both owners' partitions")
		require.EqualValues(t, 777, bal[accts[1][3]])
		require.EqualValues(t, initial, bal[accts[0][0]])
	}
	lo, hi := want[10], want[50]
	ids, _ := scan(ta, lo, hi)
	require.Equal(t, want[10:50], ids, "[lo, hi): hi excluded")

	var n int
	for _, err := range ta.ScanAll(ctx) {
		require.NoError(t, err)
		if n++; n == 5 {
			break
		}
	}
	require.Equal(t, 5, n)

	// A node that owns nothing scans every partition's durable rows.
	_, tcOwn := tc.openNodeTable(t, ctx, 0xc, "acct")
	ids, bal := scan(tcOwn, 0, ^uint64(0))
	require.Equal(t, want, ids)
	require.EqualValues(t, 777, bal[accts[1][3]])

	empty := createTable(t, ctx, a, "empty", 64, 4, 1, tc.addrs)
	for _, err := range empty.ScanAll(ctx) {
		require.NoError(t, err)
		t.Fatal("a row in an empty table")
	}
}

// acct is the typed row of TestTypedClusterTable: a balance, as balanceRow lays it out.
type acct struct{ balance uint64 }

type acctCodec struct{}

func (acctCodec) RowBytes() int                    { return 64 }
func (acctCodec) MarshalRow(dst []byte, a *acct)   { copy(dst, balanceRow(a.balance)) }
func (acctCodec) UnmarshalRow(src []byte, a *acct) { a.balance = balanceOf(src) }

// A cluster table takes the typed API like a plain one (issue 23 item 4): txnode.TypedOf over
// node.Table, its inserts, reads, updates and scans over every partition.
func TestTypedClusterTable(t *testing.T) {
	ctx := testCtx(t)
	_, _, _, ta, tb, accts := bankSetup(t, 3)
	typed, err := txnode.TypedOf[acct](ta, acctCodec{})
	require.NoError(t, err)
	id, err := typed.Insert(ctx, &acct{balance: 5})
	require.NoError(t, err)
	require.NoError(t, typed.Update(ctx, id, func(a *acct) error { a.balance += 2; return nil }))
	var got acct
	require.NoError(t, typed.Get(ctx, id, &got))
	require.Equal(t, uint64(7), got.balance)
	require.NoError(t, typed.Get(ctx, accts[1][0], &got), "another owner's partition: its durable row")
	require.EqualValues(t, initial, got.balance)
	n := 0
	for r, err := range typed.ScanAll(ctx) {
		require.NoError(t, err)
		if r.ID == id {
			require.Equal(t, uint64(7), r.Value.balance)
		}
		n++
	}
	require.Equal(t, 7, n, "3 + 3 accounts and the new one")
	_, err = txnode.TypedOf[acct](tb, wideCodec{})
	require.ErrorIs(t, err, txnode.ErrRowSize)
}

type wideCodec struct{ acctCodec }

func (wideCodec) RowBytes() int { return 128 }
