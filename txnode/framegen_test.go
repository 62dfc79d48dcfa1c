package txnode

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGetFrameReassignedTwice: a lock-free Get whose frame is evicted, filled for another
// page and evicted back to its own page between its version loads (same key, and the same
// version word after fills at the same durable version) must not return the other page's
// row. On 26994d0 with this test's hook the key check passed and Get returned page 5's
// bytes; the frame's generation (frameMeta.state) catches it and Get reads again.
func TestGetFrameReassignedTwice(t *testing.T) {
	// View's lock-free path (txnode/view.go) calls its function where Get copies: the
	// same check must hold for it.
	for _, view := range []bool{false, true} {
		t.Run(fmt.Sprintf("view=%v", view), func(t *testing.T) { testFrameReassignedTwice(t, view) })
	}
}

func testFrameReassignedTwice(t *testing.T, view bool) {
	ctx := context.Background()
	db := openEmbedded(t, t.TempDir(), Options{})
	tb, ids := newTableRows(t, ctx, db, "g", 2)
	require.NoError(t, db.pipe.flush(ctx))
	buf := make([]byte, 64)
	require.NoError(t, tb.Get(ctx, ids[1], buf))
	want := append([]byte(nil), buf...)

	c := db.cache
	page, slot := ids[1]/64, int(ids[1]%64)
	key, other := pageKey(tb.t.id, page), pageKey(tb.t.id, page+5)
	id, m := c.lookup(key)
	require.NotNil(t, m)
	versions, rows := frameWords(m, 64)
	ver := versions[slot]
	bit := uint64(1) << slot
	// move gives the frame another page, as an eviction and a fill would, keeping the
	// slot's version word.
	move := func(from, to uint64, row []byte) {
		c.mu.Lock()
		defer c.mu.Unlock()
		m.setKey(0)
		c.pt.remove(from)
		m.valid.Store(0)
		m.present.Store(0)
		copy(rows[slot*64:(slot+1)*64], row)
		versions[slot] = ver
		m.valid.Store(bit)
		m.present.Store(bit)
		m.setKey(to)
		c.pt.insert(to, id, m, m.mem.Load())
	}
	foreign := u64Row(64, 0xbad)
	calls := 0
	db.testHookGet = func() {
		calls++
		switch calls {
		case 1: // flags loaded, row not copied yet: the frame becomes page+5's
			move(key, other, foreign)
		case 2: // row copied: the frame comes back to its page
			move(other, key, want)
		}
	}
	if view {
		require.NoError(t, tb.View(ctx, ids[1], func(row []byte) error {
			copy(buf, row) // the run that counts leaves its copy
			return nil
		}))
	} else {
		require.NoError(t, tb.Get(ctx, ids[1], buf))
	}
	db.testHookGet = nil
	require.Equal(t, want, buf, "Get returned another page's row")
	require.Greater(t, calls, 2, "Get read the row again")
}
