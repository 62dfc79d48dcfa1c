package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/internal/testseed"
	"github.com/weftdb/weft/sgio"
)

// lifetimeRows is the eight 64-byte rows of page p at version v: words alternate p and v, so
// rows overwritten (partly or wholly) by another reply's bytes show. 512 bytes: above the
// Writer's CopyBelow, so a reply gathers them by reference from its pooled buffer.
func lifetimeRows(p, v uint64) []byte {
	b := make([]byte, lifetimeBytes)
	for i := range lifetimeBytes / 16 {
		binary.LittleEndian.PutUint64(b[i*16:], p)
		binary.LittleEndian.PutUint64(b[i*16+8:], v)
	}
	return b
}

const lifetimeBytes = 8 * 64

// checkLifetimeRows checks the rows read of page p and returns their version.
func checkLifetimeRows(p uint64, b []byte) (uint64, error) {
	if len(b) != lifetimeBytes {
		return 0, fmt.Errorf("page %d: %d row bytes", p, len(b))
	}
	v := binary.LittleEndian.Uint64(b[8:])
	for i := range lifetimeBytes / 16 {
		if gp, gv := binary.LittleEndian.Uint64(b[i*16:]), binary.LittleEndian.Uint64(b[i*16+8:]); gp != p || gv != v {
			return 0, fmt.Errorf("page %d: word pair %d is (%d, %d), the row's first is (%d, %d)", p, i, gp, gv, p, v)
		}
	}
	return v, nil
}

// TestServerPooledBuffersPipelined: many reads pipelined on connections that also commit
// (the commit goroutine's reused Batch, pooled commitAcks) get, in every reply, the rows of
// the pages they asked for, whole and never older than a version the same reader saw:
// pooled row buffers, the loop's reused ReadPages and segments, and pooled readTurns are
// never overwritten while a reply still references them. One client reads inline (its limit
// allows it), one always off the loop (its small reply limit sends every read to a turn),
// over plain TCP and TLS.
func TestServerPooledBuffersPipelined(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", useTLS), func(t *testing.T) { testPooledBuffersPipelined(t, useTLS) })
	}
}

func testPooledBuffersPipelined(t *testing.T, useTLS bool) {
	var serverTLS, clientTLS = testkit.TLSConfigs(t)
	env := startServer(t, func(cfg *Config) {
		if useTLS {
			cfg.TLS = serverTLS
		}
	})
	withTLS := func(cfg *sgio.ClientConfig) {
		if useTLS {
			cfg.TLS = clientTLS
		}
	}
	ctx := srvCtx(t)
	const pages = 16
	w := env.dial(testOwner, withTLS)
	ti, g := srvAllocTable(t, ctx, w, "life", pages)
	seq := uint64(0)
	commitAll := func(v uint64) *sgio.Commit {
		seq++
		c := &sgio.Commit{Owner: testOwner, Seq: seq, Fences: []base.Fence{{Table: ti.Table, Epoch: g.Epoch}}}
		for p := range uint64(pages) {
			c.Segments = append(c.Segments, base.Segment{Table: ti.Table, RowBytes: 64, Page: p, Data: 0xff, Rows: lifetimeRows(p, v)})
		}
		return c
	}
	_, err := w.Call(ctx, commitAll(1))
	require.NoError(t, err)

	// The readers: the owner's own connection (inline reads), and a second connection of
	// another owner with a small reply limit (every read leaves the loop). Both pipeline.
	slow := env.dial(testOwner+1, withTLS, func(cfg *sgio.ClientConfig) { cfg.MaxBody = 16 << 10 })
	versions := testseed.Scaled(40, 200, 2000)
	readers := testseed.Scaled(4, 8, 8)
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	report := func(err error) { // the first error is enough
		select {
		case errs <- err:
		default:
		}
	}
	wg.Add(1)
	go func() { // the committer: versions 2.. pipelined, several in flight
		defer wg.Done()
		var cw sync.WaitGroup
		sem := make(chan struct{}, 8)
		for v := uint64(2); v <= uint64(versions); v++ {
			m := commitAll(v)
			sem <- struct{}{}
			cw.Add(1)
			if err := w.Send(ctx, m, func(f sgio.Frame, err error) {
				defer cw.Done()
				<-sem
				if err == nil && f.Type != sgio.TypeCommitAck {
					err = fmt.Errorf("commit reply %v", f.Type)
				}
				if err != nil {
					report(err)
				}
			}); err != nil {
				cw.Done()
				report(err)
				break
			}
		}
		cw.Wait()
	}()
	for r := range 2 * readers {
		c := w
		if r%2 == 1 {
			c = slow
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			seen := make([]uint64, pages)
			for i := range testseed.Scaled(200, 1000, 5000) {
				// A read of a rotating run of pages (1..4), so replies differ in size
				// and in which pages they carry.
				n := 1 + (i+r)%4
				first := uint64((i*7 + r) % pages)
				m := &sgio.ReadPages{}
				for k := range n {
					m.Wants = append(m.Wants, base.PageWant{Table: ti.Table, Page: (first + uint64(k)) % pages, Want: 0xff})
				}
				var got sgio.Segments
				if err := c.CallInto(ctx, m, &got); err != nil {
					report(err)
					return
				}
				if len(got.Segments) != n {
					report(fmt.Errorf("%d segments for %d wants", len(got.Segments), n))
					return
				}
				for k, s := range got.Segments {
					p := m.Wants[k].Page
					if s.Page != p || s.Table != ti.Table || s.Data != 0xff {
						report(fmt.Errorf("segment %d is table %d page %d data %x, want page %d", k, s.Table, s.Page, s.Data, p))
						return
					}
					v, err := checkLifetimeRows(p, s.Rows)
					if err != nil {
						report(err)
						return
					}
					if v < seen[p] || v > uint64(versions) {
						report(fmt.Errorf("page %d: version %d after %d", p, v, seen[p]))
						return
					}
					seen[p] = v
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	// The last version is every page's, read by both kinds of reader.
	for _, c := range []*sgio.Client{w, slow} {
		m := &sgio.ReadPages{}
		for p := range uint64(pages) {
			m.Wants = append(m.Wants, base.PageWant{Table: ti.Table, Page: p, Want: 0xff})
		}
		var got sgio.Segments
		require.NoError(t, c.CallInto(context.WithoutCancel(ctx), m, &got))
		for k, s := range got.Segments {
			v, err := checkLifetimeRows(uint64(k), s.Rows)
			require.NoError(t, err)
			require.Equal(t, uint64(versions), v)
		}
	}
}
