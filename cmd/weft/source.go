package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"os"
	"path/filepath"
	"slices"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// A source is where the commands read: a running storage node over TCP, or a stopped store's
// directory opened in this process. Both read as a client that owns nothing, so a storage
// node answers with durable rows only and never moves a table's ownership for us. One
// goroutine uses a source at a time.
type source interface {
	// Tables lists the tables, in id order.
	Tables(ctx context.Context) ([]tableInfo, error)
	// ReadPages answers one sparse read per want, in order: the present rows of each want
	// (data mask) and their bytes in slot order. The rows stay valid until the next call.
	ReadPages(ctx context.Context, wants []base.PageWant) ([]base.Segment, error)
	// PageDir lists the pages of [lo, hi) that hold rows, at most max, and where to go on.
	PageDir(ctx context.Context, table uint32, lo, hi uint64, max int) ([]sgio.PageEntry, uint64, error)
	// Stats returns the store's counters by name.
	Stats(ctx context.Context) ([]base.Stat, error)
	Close() error
}

// tableInfo describes one table.
type tableInfo struct {
	ID       uint32
	Name     string
	RowBytes int
	NextID   uint64 // every id below it has been granted
	Rows     uint64 // rows present, or rowsUnknown (a storage node does not say; countRows asks)
}

// rowsUnknown marks a row count the source did not report.
const rowsUnknown = ^uint64(0)

// countRows counts the present rows of t from its page directory: one request per 64K pages
// (4M ids), no row bytes.
func countRows(ctx context.Context, src source, t tableInfo) (uint64, error) {
	var n uint64
	hi := (t.NextID + logicpage.RowsPerPage - 1) / logicpage.RowsPerPage
	for lo := uint64(0); lo < hi; {
		dir, next, err := src.PageDir(ctx, t.ID, lo, hi, 1<<16)
		if err != nil {
			return 0, err
		}
		for _, e := range dir {
			n += uint64(bits.OnesCount64(e.Present))
		}
		if next <= lo {
			return 0, fmt.Errorf("page directory of %q did not advance past page %d: %w", t.Name, lo, sgio.ErrMalformed)
		}
		lo = next
	}
	return n, nil
}

// findTable returns the table called name.
func findTable(ctx context.Context, src source, name string) (tableInfo, error) {
	ts, err := src.Tables(ctx)
	if err != nil {
		return tableInfo{}, err
	}
	for _, t := range ts {
		if t.Name == name {
			return t, nil
		}
	}
	return tableInfo{}, fmt.Errorf("table %q: %w", name, storenode.ErrTableNotFound)
}

// remoteSource reads a storage node through one sgio connection.
type remoteSource struct {
	c *sgio.Client
}

func dialSource(ctx context.Context, addr string, secret []byte) (*remoteSource, error) {
	c, err := sgio.Dial(ctx, sgio.ClientConfig{Addr: addr, Secret: secret, Name: "weft-cli"})
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	return &remoteSource{c: c}, nil
}

func (r *remoteSource) Tables(ctx context.Context) ([]tableInfo, error) {
	var list sgio.TableList
	if err := r.c.CallInto(ctx, &sgio.ListTables{}, &list); err != nil {
		return nil, err
	}
	out := make([]tableInfo, 0, len(list.Tables))
	for _, t := range list.Tables {
		out = append(out, tableInfo{ID: t.Table, Name: t.Name, RowBytes: int(t.RowBytes), NextID: t.NextID, Rows: rowsUnknown})
	}
	slices.SortFunc(out, func(a, b tableInfo) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

func (r *remoteSource) ReadPages(ctx context.Context, wants []base.PageWant) ([]base.Segment, error) {
	var segs sgio.Segments
	if err := r.c.CallInto(ctx, &sgio.ReadPages{Wants: wants}, &segs); err != nil {
		return nil, err
	}
	if len(segs.Segments) != len(wants) {
		return nil, fmt.Errorf("storage node answered %d segments for %d pages: %w", len(segs.Segments), len(wants), sgio.ErrMalformed)
	}
	return segs.Segments, nil
}

func (r *remoteSource) PageDir(ctx context.Context, table uint32, lo, hi uint64, max int) ([]sgio.PageEntry, uint64, error) {
	var rep sgio.PageDirReply
	if err := r.c.CallInto(ctx, &sgio.PageDir{Table: table, MaxEntries: uint32(max), Lo: lo, Hi: hi}, &rep); err != nil {
		return nil, 0, err
	}
	return rep.Entries, rep.Next, nil
}

func (r *remoteSource) Stats(ctx context.Context) ([]base.Stat, error) {
	var rep sgio.StatsReply
	if err := r.c.CallInto(ctx, &sgio.Stats{}, &rep); err != nil {
		return nil, err
	}
	return rep.Stats, nil
}

func (r *remoteSource) Close() error { return r.c.Close() }

// localSource reads a stopped store's directory through the storage engine, in this
// process. Opening it recovers the store (replays the WAL tail) as a storage node's start
// would, and takes the directory's lock, so it fails while a storage node or a game server
// has the store open.
type localSource struct {
	e   *storenode.Engine
	buf []byte
}

func openLocalSource(dir string) (*localSource, error) {
	// The engine makes a missing store; a command that reads must not leave one behind.
	if _, err := os.Stat(filepath.Join(dir, "meta")); err != nil {
		if _, werr := os.Stat(filepath.Join(dir, "wal")); werr != nil {
			return nil, fmt.Errorf("%s is not a Weft store (no meta file, no wal directory): %w", dir, err)
		}
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e, err := storenode.Open(storenode.Options{Dir: dir, Logger: logger})
	if err != nil {
		return nil, err
	}
	return &localSource{e: e}, nil
}

func (l *localSource) Tables(context.Context) ([]tableInfo, error) {
	ts := l.e.Tables()
	out := make([]tableInfo, 0, len(ts))
	for _, t := range ts {
		out = append(out, tableInfo{ID: t.ID, Name: t.Name, RowBytes: t.RowBytes, NextID: t.NextID, Rows: t.Rows})
	}
	slices.SortFunc(out, func(a, b tableInfo) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

func (l *localSource) ReadPages(ctx context.Context, wants []base.PageWant) ([]base.Segment, error) {
	segs := make([]base.Segment, 0, len(wants))
	l.buf = l.buf[:0]
	type span struct{ from, to int }
	spans := make([]span, 0, len(wants))
	for _, w := range wants {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		t, err := l.table(w.Table)
		if err != nil {
			return nil, err
		}
		from := len(l.buf)
		data, clear, out, err := l.e.ReadRows(w.Table, w.Page, w.Want, l.buf)
		if err != nil {
			return nil, err
		}
		l.buf = out
		spans = append(spans, span{from, len(out)})
		segs = append(segs, base.Segment{Table: w.Table, RowBytes: uint16(t.RowBytes), Page: w.Page, Data: data, Clear: clear})
	}
	for i := range segs { // l.buf may have moved while it grew
		segs[i].Rows = l.buf[spans[i].from:spans[i].to]
	}
	return segs, nil
}

func (l *localSource) table(id uint32) (tableInfo, error) {
	for _, t := range l.e.Tables() {
		if t.ID == id {
			return tableInfo{ID: t.ID, Name: t.Name, RowBytes: t.RowBytes, NextID: t.NextID, Rows: t.Rows}, nil
		}
	}
	return tableInfo{}, fmt.Errorf("table %d: %w", id, storenode.ErrTableNotFound)
}

func (l *localSource) PageDir(_ context.Context, table uint32, lo, hi uint64, max int) ([]sgio.PageEntry, uint64, error) {
	infos, next, err := l.e.PageDir(table, lo, hi, max, nil)
	if err != nil {
		return nil, 0, err
	}
	out := make([]sgio.PageEntry, len(infos))
	for i, p := range infos {
		out[i] = sgio.PageEntry{Page: p.Page, Present: p.Present}
	}
	return out, next, nil
}

// Stats returns the engine's stats (storenode.StatDescs), named as a storage node's StatsReply
// names them; an engine opened in-process has no server, so no server stats.
func (l *localSource) Stats(context.Context) ([]base.Stat, error) {
	s := l.e.Stats()
	return storenode.AppendStats(nil, storenode.StatDescs(), &s), nil
}

func (l *localSource) Close() error { return l.e.Close() }

// rowVisit is called for each present row of a scan, in id order. row is valid until the
// callback returns.
type rowVisit func(id uint64, row []byte) error

// readPagesMax bounds the pages of one ReadPages request of a scan: 64 pages of 4 KiB rows
// are 16 MiB of rows, the protocol's largest body.
const readPagesMax = 64

// scanRows visits the present rows of ids [lo, hi) of t in id order: the page directory
// says which pages hold rows, and whole runs of them are read at once.
func scanRows(ctx context.Context, src source, t tableInfo, lo, hi uint64, visit rowVisit) error {
	if lo >= hi {
		return nil
	}
	pageLo, pageHi := lo/logicpage.RowsPerPage, (hi-1)/logicpage.RowsPerPage+1
	perReq := max(1, min(readPagesMax, (8<<20)/(t.RowBytes*logicpage.RowsPerPage)))
	for pageLo < pageHi {
		dir, next, err := src.PageDir(ctx, t.ID, pageLo, pageHi, 4096)
		if err != nil {
			return err
		}
		if next <= pageLo && len(dir) == 0 {
			return fmt.Errorf("page directory of %q did not advance past page %d: %w", t.Name, pageLo, sgio.ErrMalformed)
		}
		for len(dir) > 0 {
			n := min(len(dir), perReq)
			wants := make([]base.PageWant, n)
			for i, e := range dir[:n] {
				wants[i] = base.PageWant{Table: t.ID, Page: e.Page, Want: e.Present & idMask(e.Page, lo, hi)}
			}
			segs, err := src.ReadPages(ctx, wants)
			if err != nil {
				return err
			}
			for _, s := range segs {
				rows := s.Rows
				for m := s.Data; m != 0; m &= m - 1 {
					slot := uint64(bits.TrailingZeros64(m))
					if err := visit(s.Page*logicpage.RowsPerPage+slot, rows[:t.RowBytes]); err != nil {
						return err
					}
					rows = rows[t.RowBytes:]
				}
			}
			dir = dir[n:]
		}
		if next <= pageLo {
			return fmt.Errorf("page directory of %q did not advance past page %d: %w", t.Name, pageLo, sgio.ErrMalformed)
		}
		pageLo = next
	}
	return nil
}

// idMask returns the slots of page whose ids lie in [lo, hi).
func idMask(page, lo, hi uint64) uint64 {
	first := page * logicpage.RowsPerPage
	m := ^uint64(0)
	if lo > first {
		m &^= 1<<(lo-first) - 1
	}
	if hi < first+logicpage.RowsPerPage {
		m &= 1<<(hi-first) - 1
	}
	return m
}

// getRow reads row id of t into a new slice; sgio.ErrNotFound-like absence is errNoRow.
func getRow(ctx context.Context, src source, t tableInfo, id uint64) ([]byte, error) {
	page, slot := id/logicpage.RowsPerPage, id%logicpage.RowsPerPage
	segs, err := src.ReadPages(ctx, []base.PageWant{{Table: t.ID, Page: page, Want: 1 << slot}})
	if err != nil {
		return nil, err
	}
	if segs[0].Data&(1<<slot) == 0 {
		return nil, fmt.Errorf("table %q id %d: %w", t.Name, id, errNoRow)
	}
	return slices.Clone(segs[0].Rows[:t.RowBytes]), nil
}

// errNoRow reports an id that holds no row.
var errNoRow = errors.New("no such row")
