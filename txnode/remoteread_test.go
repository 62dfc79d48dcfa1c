package txnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// batchMember is one read of a merged batch under test: what its fill saw.
type batchMember struct {
	r    *remoteRead
	rows map[uint64][]byte // page -> rows filled
}

func newBatchMember(t *testing.T, b *readBatch, wants ...base.PageWant) *batchMember {
	t.Helper()
	m := &batchMember{rows: map[uint64][]byte{}}
	reqs := wants
	m.r = getRemoteRead(reqs, func(i int, data, clear uint64, rows []byte) {
		m.rows[reqs[i].Page] = append([]byte(nil), rows...)
	})
	require.True(t, b.join(b.conn, m.r))
	return m
}

// segmentsBody encodes a Segments reply of one 64-byte row (bytes v) per want.
func segmentsBody(wants []base.PageWant, v byte) []byte {
	r := &sgio.Segments{}
	for _, w := range wants {
		row := make([]byte, 64)
		for i := range row {
			row[i] = v
		}
		r.Segments = append(r.Segments, base.Segment{Table: w.Table, RowBytes: 64, Page: w.Page, Data: w.Want, Rows: row})
	}
	return r.AppendBody(nil)
}

func outcome(t *testing.T, r *remoteRead) error {
	t.Helper()
	select {
	case err := <-r.done:
		return err
	default:
		t.Fatal("a member was not woken")
		return nil
	}
}

// A merged reply is checked whole, then each member gets exactly its own segments, in order,
// and is woken; a member that gave up (abandoned) is skipped, the others are not.
func TestReadBatchReplyFillsEachMember(t *testing.T) {
	b := getReadBatch(nil)
	a := newBatchMember(t, b, base.PageWant{Table: 1, Page: 4, Want: 1}, base.PageWant{Table: 1, Page: 9, Want: 1})
	gone := newBatchMember(t, b, base.PageWant{Table: 2, Page: 4, Want: 1})
	c := newBatchMember(t, b, base.PageWant{Table: 2, Page: 5, Want: 1})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, gone.r.wait(ctx), context.Canceled) // abandoned
	wants := append([]base.PageWant(nil), b.msg.Wants...)
	b.onReply(sgio.Frame{Type: sgio.TypeSegments, Body: segmentsBody(wants, 7)}, nil)
	require.NoError(t, outcome(t, a.r))
	require.NoError(t, outcome(t, c.r))
	require.Len(t, a.rows, 2)
	require.Contains(t, a.rows, uint64(4))
	require.Contains(t, a.rows, uint64(9))
	require.Empty(t, gone.rows)
	require.Len(t, c.rows, 1)
	require.Contains(t, c.rows, uint64(5))
}

// A reply whose segments do not answer the wants (a page swapped) fills nothing and fails
// every member with ErrMalformed; a reply with too few segments too.
func TestReadBatchReplyChecked(t *testing.T) {
	for _, name := range []string{"swapped", "short"} {
		t.Run(name, func(t *testing.T) {
			b := getReadBatch(nil)
			a := newBatchMember(t, b, base.PageWant{Table: 1, Page: 4, Want: 1})
			c := newBatchMember(t, b, base.PageWant{Table: 1, Page: 5, Want: 1})
			wants := append([]base.PageWant(nil), b.msg.Wants...)
			if name == "swapped" {
				wants[0], wants[1] = wants[1], wants[0]
			} else {
				wants = wants[:1]
			}
			b.onReply(sgio.Frame{Type: sgio.TypeSegments, Body: segmentsBody(wants, 7)}, nil)
			require.ErrorIs(t, outcome(t, a.r), sgio.ErrMalformed)
			require.ErrorIs(t, outcome(t, c.r), sgio.ErrMalformed)
			require.Empty(t, a.rows)
			require.Empty(t, c.rows)
		})
	}
}

// An Error reply to a batch of several reads may concern one of them (its table dropped):
// each member is told to read again alone, to learn its own outcome; a lone member gets the
// error itself, and a broken connection is every member's (retryable) error.
func TestReadBatchErrorReply(t *testing.T) {
	b := getReadBatch(nil)
	a := newBatchMember(t, b, base.PageWant{Table: 1, Page: 4, Want: 1})
	c := newBatchMember(t, b, base.PageWant{Table: 2, Page: 4, Want: 1})
	b.onReply(sgio.Frame{Type: sgio.TypeError}, sgio.ErrTableNotFound)
	require.ErrorIs(t, outcome(t, a.r), errReadAgain)
	require.ErrorIs(t, outcome(t, c.r), errReadAgain)
	require.True(t, a.r.alone)
	require.True(t, c.r.alone)

	b = getReadBatch(nil)
	lone := newBatchMember(t, b, base.PageWant{Table: 1, Page: 4, Want: 1})
	b.onReply(sgio.Frame{Type: sgio.TypeError}, sgio.ErrTableNotFound)
	require.ErrorIs(t, outcome(t, lone.r), sgio.ErrTableNotFound)

	b = getReadBatch(nil)
	a = newBatchMember(t, b, base.PageWant{Table: 1, Page: 4, Want: 1})
	c = newBatchMember(t, b, base.PageWant{Table: 1, Page: 5, Want: 1})
	broken := errors.Join(sgio.ErrConnClosed, errors.New("read: EOF"))
	b.onReply(sgio.Frame{}, broken)
	require.ErrorIs(t, outcome(t, a.r), sgio.ErrConnClosed)
	require.ErrorIs(t, outcome(t, c.r), sgio.ErrConnClosed)
	require.False(t, a.r.alone)
}

// A batch is bounded before a read joins it, and a sealed batch (taken by the sender, or
// answered) takes no more reads.
func TestReadBatchJoinBounds(t *testing.T) {
	b := getReadBatch(nil)
	for range readMergeWantsMax {
		newBatchMember(t, b, base.PageWant{Table: 1, Page: 1, Want: 1})
	}
	extra := getRemoteRead([]base.PageWant{{Table: 1, Page: 2, Want: 1}}, func(int, uint64, uint64, []byte) {})
	require.False(t, b.join(nil, extra), "a full batch took another read")
	require.Equal(t, 8+24*readMergeWantsMax, b.BodySize())

	b = getReadBatch(nil)
	newBatchMember(t, b, base.PageWant{Table: 1, Page: 1, Want: 1})
	b.Seal()
	require.False(t, b.join(nil, extra), "a sealed batch took another read")
	other := &sgio.Client{}
	b = getReadBatch(nil)
	require.False(t, b.join(other, extra), "a batch of another connection took a read")
}

// Many goroutines missing at once, over TCP, in two tables of different row sizes: their
// reads share frames, and every Get returns its own row (a row routed to another member, or
// another table's, would show as a wrong id or a torn row). The merge factor is logged, not
// asserted (it depends on timing).
func TestRemoteMergedMissesGetTheirRows(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	addr, _ := startStorageNodeWith(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone})
	db := openDB(t, ctx, Options{StoreAddr: addr, CacheBytes: 64 << 10, OwnerID: 44})
	defer db.Close(ctx)
	sizes := []int{64, 256}
	rows := 64 * 40 // 40 pages a table: several times what the cache holds
	tables := make([]*Table, len(sizes))
	ids := make([][]uint64, len(sizes))
	for k, rb := range sizes {
		var err error
		tables[k], err = db.CreateTable(ctx, fmt.Sprintf("m%d", rb), rb)
		require.NoError(t, err)
		for i := range rows {
			id, err := tables[k].Insert(ctx, u64Row(rb, uint64(k*rows+i)))
			require.NoError(t, err)
			ids[k] = append(ids[k], id)
		}
	}
	st := db.store.(*remoteStore)
	before := st.conn.Stats()
	missesBefore := db.Stats().PageMisses
	workers, gets := 64, 400
	if testing.Short() {
		workers, gets = 16, 200
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			bufs := [][]byte{make([]byte, 64), make([]byte, 256)}
			for range gets {
				k := rng.IntN(len(sizes))
				i := rng.IntN(rows)
				if err := tables[k].Get(ctx, ids[k][i], bufs[k]); err != nil {
					errs <- err
					return
				}
				if want := u64Row(sizes[k], uint64(k*rows+i)); !bytes.Equal(bufs[k], want) {
					errs <- fmt.Errorf("table %d row %d: got another row", k, i)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	after := st.conn.Stats()
	misses := db.Stats().PageMisses - missesBefore
	t.Logf("%d misses in %d requests (%d writes)", misses, after.Requests-before.Requests, after.Writes-before.Writes)
	require.Greater(t, misses, uint64(workers), "the Gets missed")
}
