package store

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/storenode"
)

// embedded is the embedded store: an in-process storage engine, no TCP. It converts between
// the transaction node's types and the engine's; rows are never copied on the way in (the
// engine copies them into its WAL and cache).
type embedded struct {
	e *storenode.Engine
	// closed is set by Close: the calls the engine answers without an error of its own
	// (ListTables, Ping) report the closed store after it, like every other.
	closed atomic.Bool
}

// OpenEmbedded opens (creating) an embedded store in opts.Dir: a storenode.Engine in this
// process. Nobody else can reach it, so its grants never expire (Info's Lease is 0). txnode.Open
// opens one for Options.Dir with ExpireLeasesAtOpen set; set it too, or a table a crashed run
// held stays owned for a lease.
func OpenEmbedded(opts storenode.Options) (Store, error) {
	e, err := storenode.Open(opts)
	if err != nil {
		return nil, err
	}
	return &embedded{e: e}, nil
}

func (s *embedded) Info() Info {
	return Info{SyncMode: s.e.SyncMode().String(), MaxBatchBytes: 64 << 20}
}

func (s *embedded) CreateTable(ctx context.Context, name string, rowBytes int) (base.TableInfo, error) {
	if err := ctx.Err(); err != nil {
		return base.TableInfo{}, err
	}
	t, err := s.e.CreateTable(name, rowBytes)
	return t, closedErr(err)
}

func (s *embedded) CreateClusterTable(ctx context.Context, name string, rowBytes int, l base.ClusterLayout) (base.TableInfo, error) {
	if err := ctx.Err(); err != nil {
		return base.TableInfo{}, err
	}
	t, err := s.e.CreateClusterTable(name, rowBytes, l)
	return t, closedErr(err)
}

func (s *embedded) OpenTable(ctx context.Context, name string) (base.TableInfo, error) {
	if err := ctx.Err(); err != nil {
		return base.TableInfo{}, err
	}
	t, err := s.e.OpenTable(name)
	return t, closedErr(err)
}

func (s *embedded) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return closedErr(storenode.ErrClosed)
	}
	return nil
}

func (s *embedded) ListTables(ctx context.Context) ([]base.TableInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s.closed.Load() {
		return nil, closedErr(storenode.ErrClosed)
	}
	return s.e.Tables(), nil
}

func (s *embedded) DropTable(ctx context.Context, name string, owner uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return closedErr(s.e.DropTable(name, owner))
}

func (s *embedded) Acquire(ctx context.Context, table uint32, owner, epoch uint64, flags AcquireFlags) (base.Grant, error) {
	if err := ctx.Err(); err != nil {
		return base.Grant{}, err
	}
	var g base.Grant
	var err error
	if flags&AcquireEtcdGrant != 0 {
		g, err = s.e.RegisterGrant(ctx, table, owner, epoch)
	} else {
		g, err = s.e.Acquire(table, owner, epoch)
	}
	g.Lease = 0 // nobody else can reach an embedded engine: the lease never needs checking
	return g, closedErr(err)
}

func (s *embedded) AllocIDs(ctx context.Context, table uint32, owner, epoch uint64, pages int) (uint64, uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	first, count, err := s.e.AllocIDs(table, owner, epoch, pages)
	return first, count, closedErr(err)
}

func (s *embedded) Read(ctx context.Context, reqs []base.PageWant, fill func(int, uint64, uint64, []byte)) error {
	var buf []byte
	for i, r := range reqs {
		if err := ctx.Err(); err != nil {
			return err
		}
		data, clear, out, err := s.e.ReadRows(r.Table, r.Page, r.Want, buf[:0])
		if err != nil {
			return closedErr(err)
		}
		fill(i, data, clear, out)
		buf = out
	}
	return nil
}

func (s *embedded) PageDir(ctx context.Context, table uint32, lo, hi uint64, max int, dst []PageInfo) ([]PageInfo, uint64, error) {
	if err := ctx.Err(); err != nil {
		return dst, 0, err
	}
	pages, next, err := s.e.PageDir(table, lo, hi, max, nil)
	for _, p := range pages {
		dst = append(dst, PageInfo{Page: p.Page, Present: p.Present})
	}
	return dst, next, closedErr(err)
}

func (s *embedded) Commit(b *base.Batch, done func(uint64, error)) {
	if s.closed.Load() {
		done(0, closedErr(storenode.ErrClosed))
		return
	}
	// Commit copies the rows into the cache; the WAL may write them from the batch (kept, not
	// copied), which the Store contract keeps unchanged until done. Commit keeps neither
	// slice once it returns.
	s.e.Commit(b, done)
}

func (s *embedded) Close() error {
	s.closed.Store(true)
	err := s.e.Close()
	if errors.Is(err, storenode.ErrClosed) {
		return nil
	}
	return err
}
