package txnode

import (
	"context"
	"iter"
	"math/bits"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/txnode/store"
)

// scan returns the rows of ids in [lo, hi) in id order, as the store has them durably (see
// durableTable): the store's page directory skips empty ranges, then the pages holding rows
// are read scanDirBatch at a time, only their present rows crossing the wire. A read pass,
// not a snapshot. Row.Data stays valid until the loop asks for the next row. An error ends
// the sequence as its last element.
func (t *durableTable) scan(ctx context.Context, lo, hi uint64) iter.Seq2[Row, error] {
	return func(yield func(Row, error) bool) {
		if t.DB.closed.Load() {
			yield(Row{}, ErrClosed)
			return
		}
		hi = min(hi, logicpage.TablePagesMax*logicpage.RowsPerPage)
		if lo >= hi {
			return
		}
		rowBytes := t.Info.RowBytes
		loPage, hiPage := lo/logicpage.RowsPerPage, (hi+logicpage.RowsPerPage-1)/logicpage.RowsPerPage
		var dir []store.PageInfo
		reqs := make([]base.PageWant, 0, scanDirBatch)
		pages := make([]struct { // what each request's reply left: rows in slot order
			data uint64
			rows []byte
		}, scanDirBatch)
		out := make([]byte, rowBytes)
		for page := loPage; page < hiPage; {
			var err error
			dir, page, err = t.DB.store.PageDir(ctx, t.Info.ID, page, hiPage, scanDirBatch, dir[:0])
			if err != nil {
				yield(Row{}, err)
				return
			}
			reqs = reqs[:0]
			for _, p := range dir {
				reqs = append(reqs, base.PageWant{Table: t.Info.ID, Page: p.Page, Want: p.Present})
			}
			err = t.DB.store.Read(ctx, reqs, func(i int, data, _ uint64, rows []byte) {
				pages[i].data = data
				pages[i].rows = append(pages[i].rows[:0], rows[:min(len(rows), bits.OnesCount64(data)*rowBytes)]...)
			})
			if err != nil {
				yield(Row{}, err)
				return
			}
			for i, r := range reqs {
				p := &pages[i]
				base := r.Page * logicpage.RowsPerPage
				n := 0
				for m := p.data; m != 0; m &= m - 1 {
					id := base + uint64(bits.TrailingZeros64(m))
					at := n * rowBytes
					n++
					if id < lo || id >= hi || at+rowBytes > len(p.rows) {
						continue
					}
					copy(out, p.rows[at:at+rowBytes])
					if !yield(Row{ID: id, Data: out}, nil) {
						return
					}
				}
				p.data = 0
			}
		}
	}
}
