package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testseed"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// Rows of the writers of the shutdown and kill -9 tests: each writer owns a table and writes
// the same eight rows (ids 0..3 and 64..67: two pages, two segments) in every batch, each row
// holding (writer, seq, index) and a checksum. So after any crash each row must check, all
// eight must carry the same seq (no batch half-applied), and that seq must be the owner's last
// applied one, at least its last acknowledged one.

var stormRowIDs = [...]uint64{0, 1, 2, 3, 64, 65, 66, 67}

var stormCRC = crc32.MakeTable(crc32.Castagnoli)

// stormRow fills a 64-byte row: writer, seq, index, filler, checksum of the first 56 bytes.
func stormRow(dst []byte, writer int, seq uint64, i int) {
	binary.LittleEndian.PutUint64(dst[0:], uint64(writer))
	binary.LittleEndian.PutUint64(dst[8:], seq)
	binary.LittleEndian.PutUint64(dst[16:], uint64(i))
	for k := 24; k < 56; k += 8 {
		binary.LittleEndian.PutUint64(dst[k:], seq*0x9e3779b97f4a7c15+uint64(k))
	}
	binary.LittleEndian.PutUint64(dst[56:], uint64(crc32.Checksum(dst[:56], stormCRC)))
}

// stormBatch is the commit of writer's batch seq.
func stormBatch(table uint32, owner, epoch, seq uint64, writer int) *sgio.Commit {
	rows := make([]byte, 64*len(stormRowIDs))
	for i := range stormRowIDs {
		stormRow(rows[i*64:(i+1)*64], writer, seq, i)
	}
	return &sgio.Commit{Owner: owner, Seq: seq, Fences: []base.Fence{{Table: table, Epoch: epoch}},
		Segments: []base.Segment{
			{Table: table, RowBytes: 64, Page: 0, Data: 0xf, Rows: rows[:256]},
			{Table: table, RowBytes: 64, Page: 1, Data: 0xf, Rows: rows[256:]},
		}}
}

// checkStormRows checks a writer's rows as read back (segments for pages 0 and 1, mask 0xf
// each) against the owner's last applied seq.
func checkStormRows(segs []base.Segment, writer int, lastSeq uint64) error {
	if len(segs) != 2 {
		return fmt.Errorf("writer %d: %d segments", writer, len(segs))
	}
	i := 0
	for _, s := range segs {
		if lastSeq == 0 {
			if s.Data != 0 {
				return fmt.Errorf("writer %d: rows present %#x but no batch applied", writer, s.Data)
			}
			continue
		}
		if s.Data != 0xf {
			return fmt.Errorf("writer %d page %d: present %#x, want 0xf (a batch half applied?)", writer, s.Page, s.Data)
		}
		for k := range 4 {
			row := s.Rows[k*64 : (k+1)*64]
			if got, want := binary.LittleEndian.Uint64(row[56:]), uint64(crc32.Checksum(row[:56], stormCRC)); got != want {
				return fmt.Errorf("writer %d row %d: checksum %#x, want %#x", writer, i, got, want)
			}
			w, seq, idx := binary.LittleEndian.Uint64(row), binary.LittleEndian.Uint64(row[8:]), binary.LittleEndian.Uint64(row[16:])
			if w != uint64(writer) || idx != uint64(i) {
				return fmt.Errorf("writer %d row %d: holds writer %d row %d", writer, i, w, idx)
			}
			if seq != lastSeq {
				return fmt.Errorf("writer %d row %d: seq %d, the owner's last applied seq is %d (half a batch?)", writer, i, seq, lastSeq)
			}
			i++
		}
	}
	return nil
}

// stormWriter commits batches of one writer through c with up to depth in flight, until a
// request fails or stop closes. acked is the highest acknowledged seq, sent the highest
// sent; both are updated as it goes (under mu).
type stormWriter struct {
	writer int
	owner  uint64
	table  uint32
	epoch  uint64
	next   uint64 // next seq to send

	// reached, when set, is closed once acked reaches notifyAt.
	notifyAt uint64
	reached  chan struct{}

	mu    sync.Mutex
	acked uint64
	sent  uint64
	err   error
}

func (w *stormWriter) run(ctx context.Context, c *sgio.Client, depth int, stop <-chan struct{}) {
	slots := make(chan struct{}, depth)
	var inflight sync.WaitGroup
	defer inflight.Wait()
	for {
		select {
		case <-stop:
			return
		case slots <- struct{}{}:
		}
		w.mu.Lock()
		failed := w.err != nil
		seq := w.next
		w.next++
		w.sent = max(w.sent, seq)
		w.mu.Unlock()
		if failed {
			return
		}
		inflight.Add(1)
		err := c.Send(ctx, stormBatch(w.table, w.owner, w.epoch, seq, w.writer), func(f sgio.Frame, err error) {
			defer inflight.Done()
			defer func() { <-slots }()
			w.mu.Lock()
			defer w.mu.Unlock()
			if err != nil {
				if w.err == nil {
					w.err = err
				}
				return
			}
			var ack sgio.CommitAck
			if perr := ack.Parse(f.Body); perr != nil || ack.Seq != seq {
				w.err = fmt.Errorf("writer %d: ack %+v for seq %d: %v", w.writer, ack, seq, perr)
				return
			}
			if seq < w.acked {
				w.err = fmt.Errorf("writer %d: ack of seq %d after seq %d", w.writer, seq, w.acked)
				return
			}
			w.acked = seq
			if w.reached != nil && seq >= w.notifyAt {
				close(w.reached)
				w.reached = nil
			}
		})
		if err != nil {
			inflight.Done()
			w.mu.Lock()
			if w.err == nil {
				w.err = err
			}
			w.mu.Unlock()
			return
		}
	}
}

// TestServerShutdownDuringCommitStorm: a Shutdown while many clients commit answers or fails
// every request it took, and every acknowledged batch is in the store after a reopen, whole.
func TestServerShutdownDuringCommitStorm(t *testing.T) {
	for _, mode := range []storenode.SyncMode{storenode.SyncNone, storenode.SyncAlways} {
		t.Run("sync="+mode.String(), func(t *testing.T) {
			seed := rand.Uint64()
			rng := rand.New(rand.NewPCG(seed, 1))
			t.Logf("seed %d", seed)
			dir := t.TempDir()
			env := startServer(t, func(cfg *Config) {
				cfg.Options.Dir, cfg.Options.Sync = dir, mode
				cfg.Options.CheckpointWALBytes = 256 << 10
			})
			writers := testseed.Scaled(8, 32, 64)
			ctx := srvCtx(t)
			ws := make([]*stormWriter, writers)
			clients := make([]*sgio.Client, writers)
			for i := range ws {
				owner := uint64(100 + i)
				c := env.dial(owner)
				ti, g := srvTable(t, c, fmt.Sprintf("storm%02d", i), owner)
				ws[i] = &stormWriter{writer: i, owner: owner, table: ti.Table, epoch: g.Epoch, next: 1}
				clients[i] = c
			}
			reached := make(chan struct{})
			ws[0].notifyAt, ws[0].reached = uint64(20+rng.IntN(200)), reached
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for i, w := range ws {
				depth := 1 + rng.IntN(16)
				wg.Go(func() { w.run(ctx, clients[i], depth, stop) })
			}
			// Let the storm build, then shut down in the middle of it.
			select {
			case <-reached:
			case <-ctx.Done():
				t.Fatal("the storm did not build")
			}
			require.NoError(t, env.srv.Shutdown(ctx))
			close(stop)
			wg.Wait()

			e, err := storenode.Open(storenode.Options{Dir: dir, Logger: quietLogger})
			require.NoError(t, err)
			defer e.Close()
			for _, w := range ws {
				g, err := e.Acquire(w.table, w.owner, 0)
				require.NoError(t, err)
				require.GreaterOrEqual(t, g.LastSeq, w.acked, "writer %d: an acknowledged batch was lost", w.writer)
				require.LessOrEqual(t, g.LastSeq, w.sent, "writer %d", w.writer)
				var segs []base.Segment
				for page := range uint64(2) {
					data, clear, rows, err := e.ReadRows(w.table, page, 0xf, nil)
					require.NoError(t, err)
					segs = append(segs, base.Segment{Page: page, Data: data, Clear: clear, Rows: rows})
				}
				require.NoError(t, checkStormRows(segs, w.writer, g.LastSeq))
				require.NotErrorIs(t, w.err, sgio.ErrFenced)
			}
			require.Positive(t, ws[0].acked)
			var acked, refused, closed int
			for _, w := range ws {
				acked += int(w.acked)
				switch {
				case errors.Is(w.err, sgio.ErrShuttingDown):
					refused++
				case errors.Is(w.err, sgio.ErrConnClosed):
					closed++
				}
			}
			t.Logf("%d writers, %d batches acknowledged; writers stopped by ErrShuttingDown %d, by the close %d",
				writers, acked, refused, closed)
		})
	}
}

// TestServerShutdownIdle: Shutdown of a server with idle sessions and a refused connection
// closes them all; Shutdown is idempotent; an engine given by the caller stays open.
func TestServerShutdownIdle(t *testing.T) {
	e := openTest(t, storenode.Options{Sync: storenode.SyncNone, Logger: quietLogger})
	env := startServer(t, func(cfg *Config) { cfg.Engine = e })
	c := env.dial(1)
	ctx := srvCtx(t)
	require.NoError(t, env.srv.Shutdown(ctx))
	require.NoError(t, env.srv.Shutdown(ctx))
	select {
	case <-c.Done():
	case <-time.After(srvTestTimeout):
		t.Fatal("client not disconnected")
	}
	_, err := e.CreateTable("still-open", 64)
	require.NoError(t, err)
}
