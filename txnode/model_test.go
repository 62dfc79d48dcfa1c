package txnode

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/internal/testseed"
)

// Model-based tests: random operations against the DB and against a map, which must agree.
// Every run prints its seed; WEFT_SEED=<seed> replays it (with -run naming the subtest).
// The DB holds tables of several row sizes in one cache, so frames of different sizes evict
// each other; small caches make every page come and go.

var modelRowSizes = []int{8, 64, 520}

func modelSeed(t *testing.T) uint64 {
	t.Helper()
	return testseed.Seed(t)
}

// errModelAbort is what a test closure returns to roll its transaction back.
var errModelAbort = errors.New("model: abort")

// modelTable is one table and what the model says it holds.
type modelTable struct {
	name     string
	rowBytes int
	tb       *Table
	rows     map[uint64]uint64 // id -> value of the row
	ids      []uint64          // every id ever handed out, rows or holes
}

// model is the expected state. A transaction writes into overlay (nil: deleted), which is
// applied when it commits and dropped when it rolls back or runs again.
type model struct {
	t       *testing.T
	rng     *rand.Rand
	tables  []*modelTable
	value   uint64 // the last row value written; every write gets a new one
	overlay map[modelKey]*uint64
}

type modelKey struct {
	table int
	id    uint64
}

func (m *model) newValue() uint64 {
	m.value++
	return m.value
}

func (m *model) lookup(ti int, id uint64) (uint64, bool) {
	if m.overlay != nil {
		if v, ok := m.overlay[modelKey{ti, id}]; ok {
			if v == nil {
				return 0, false
			}
			return *v, true
		}
	}
	v, ok := m.tables[ti].rows[id]
	return v, ok
}

func (m *model) set(ti int, id uint64, v uint64, present bool) {
	var p *uint64
	if present {
		p = &v
	}
	if m.overlay != nil {
		m.overlay[modelKey{ti, id}] = p
		return
	}
	if present {
		m.tables[ti].rows[id] = v
	} else {
		delete(m.tables[ti].rows, id)
	}
}

func (m *model) begin() { m.overlay = map[modelKey]*uint64{} }

func (m *model) end(commit bool) {
	if commit {
		for k, v := range m.overlay {
			if v == nil {
				delete(m.tables[k.table].rows, k.id)
			} else {
				m.tables[k.table].rows[k.id] = *v
			}
		}
	}
	m.overlay = nil
}

// pickID returns an id to read or write: mostly one that holds a row, sometimes a hole or a
// deleted row, sometimes one never handed out.
func (m *model) pickID(ti int) uint64 {
	mt := m.tables[ti]
	switch r := m.rng.IntN(10); {
	case r < 7 && len(mt.rows) > 0:
		for range 8 { // a row that exists, most of the time
			id := mt.ids[m.rng.IntN(len(mt.ids))]
			if _, ok := m.lookup(ti, id); ok {
				return id
			}
		}
		fallthrough
	case r < 9 && len(mt.ids) > 0:
		return mt.ids[m.rng.IntN(len(mt.ids))]
	default:
		hi := uint64(128)
		if len(mt.ids) > 0 {
			hi += mt.ids[len(mt.ids)-1]
		}
		return m.rng.Uint64N(hi)
	}
}

func (m *model) pickRange(ti int, maxSpan uint64) (lo, hi uint64) {
	mt := m.tables[ti]
	top := uint64(64)
	if len(mt.ids) > 0 {
		top += mt.ids[len(mt.ids)-1]
	}
	lo = m.rng.Uint64N(top)
	if maxSpan == 0 && m.rng.IntN(4) == 0 {
		return lo, math.MaxUint64
	}
	span := max(maxSpan, 1)
	if maxSpan == 0 {
		span = 512
	}
	return lo, lo + m.rng.Uint64N(span)
}

// expectScan is the model's rows of table ti in [lo, hi), in id order.
func (m *model) expectScan(ti int, lo, hi uint64) []modelRow {
	var out []modelRow
	seen := map[uint64]bool{}
	for id := range m.tables[ti].rows {
		seen[id] = true
	}
	for k := range m.overlay {
		if k.table == ti {
			seen[k.id] = true
		}
	}
	for id := range seen {
		if id < lo || id >= hi {
			continue
		}
		if v, ok := m.lookup(ti, id); ok {
			out = append(out, modelRow{id, v})
		}
	}
	slices.SortFunc(out, func(a, b modelRow) int {
		if a.id < b.id {
			return -1
		}
		return 1
	})
	return out
}

type modelRow struct{ id, v uint64 }

// ops is what a test can run a random operation through: a transaction or the table API.
type modelOps interface {
	get(mt *modelTable, id uint64, dst []byte) error
	put(mt *modelTable, id uint64, row []byte) error
	update(mt *modelTable, id uint64, fn func([]byte) error) error
	del(mt *modelTable, id uint64) error
	insert(mt *modelTable, row []byte) (uint64, error)
	scan(mt *modelTable, lo, hi uint64) ([]modelRow, error)
}

type tableOps struct{ ctx context.Context }

func (o tableOps) get(mt *modelTable, id uint64, dst []byte) error { return mt.tb.Get(o.ctx, id, dst) }
func (o tableOps) put(mt *modelTable, id uint64, row []byte) error { return mt.tb.Put(o.ctx, id, row) }
func (o tableOps) update(mt *modelTable, id uint64, fn func([]byte) error) error {
	return mt.tb.Update(o.ctx, id, fn)
}
func (o tableOps) del(mt *modelTable, id uint64) error               { return mt.tb.Delete(o.ctx, id) }
func (o tableOps) insert(mt *modelTable, row []byte) (uint64, error) { return mt.tb.Insert(o.ctx, row) }
func (o tableOps) scan(mt *modelTable, lo, hi uint64) ([]modelRow, error) {
	return collectScan(mt.tb.Scan(o.ctx, lo, hi))
}

type txOps struct{ tx *Tx }

func (o txOps) get(mt *modelTable, id uint64, dst []byte) error { return o.tx.Get(mt.tb, id, dst) }
func (o txOps) put(mt *modelTable, id uint64, row []byte) error { return o.tx.Put(mt.tb, id, row) }
func (o txOps) update(mt *modelTable, id uint64, fn func([]byte) error) error {
	return o.tx.Update(mt.tb, id, fn)
}
func (o txOps) del(mt *modelTable, id uint64) error               { return o.tx.Delete(mt.tb, id) }
func (o txOps) insert(mt *modelTable, row []byte) (uint64, error) { return o.tx.Insert(mt.tb, row) }
func (o txOps) scan(mt *modelTable, lo, hi uint64) ([]modelRow, error) {
	return collectScan(o.tx.Scan(mt.tb, lo, hi))
}

func collectScan(seq func(func(Row, error) bool)) ([]modelRow, error) {
	var out []modelRow
	var err error
	seq(func(r Row, e error) bool {
		if e != nil {
			err = e
			return false
		}
		out = append(out, modelRow{r.ID, binary.LittleEndian.Uint64(r.Data)})
		return true
	})
	return out, err
}

// step runs one random single operation through ops and checks it against the model. inTx:
// ops is a transaction (scans stay small: a transaction pins what it scans). It returns an
// error only for errors the model does not predict.
func (m *model) step(ops modelOps, inTx bool) error {
	ti := m.rng.IntN(len(m.tables))
	mt := m.tables[ti]
	buf := make([]byte, mt.rowBytes)
	switch r := m.rng.IntN(100); {
	case r < 20: // insert
		v := m.newValue()
		id, err := ops.insert(mt, u64Row(mt.rowBytes, v))
		if err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		if len(mt.ids) > 0 && id <= mt.ids[len(mt.ids)-1] { // one goroutine: ids ascend
			return fmt.Errorf("insert into %s returned id %d, not above %d handed out before", mt.name, id, mt.ids[len(mt.ids)-1])
		}
		mt.ids = append(mt.ids, id)
		m.set(ti, id, v, true)
	case r < 45: // get
		id := m.pickID(ti)
		want, ok := m.lookup(ti, id)
		err := ops.get(mt, id, buf)
		if !ok {
			if !errors.Is(err, ErrNotFound) {
				return fmt.Errorf("get %s/%d: want ErrNotFound, got %v", mt.name, id, err)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("get %s/%d: %w", mt.name, id, err)
		}
		if got := checkRow(m.t, buf); got != want {
			return fmt.Errorf("get %s/%d: value %d, want %d", mt.name, id, got, want)
		}
	case r < 60: // put
		id := m.pickID(ti)
		_, ok := m.lookup(ti, id)
		v := m.newValue()
		err := ops.put(mt, id, u64Row(mt.rowBytes, v))
		if !ok {
			if !errors.Is(err, ErrNotFound) {
				return fmt.Errorf("put %s/%d: want ErrNotFound, got %v", mt.name, id, err)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("put %s/%d: %w", mt.name, id, err)
		}
		m.set(ti, id, v, true)
	case r < 72: // update, sometimes failing
		id := m.pickID(ti)
		old, ok := m.lookup(ti, id)
		v := m.newValue()
		fail := m.rng.IntN(4) == 0
		var seen uint64
		err := ops.update(mt, id, func(row []byte) error {
			seen = binary.LittleEndian.Uint64(row)
			fillRow(row, v)
			if fail {
				return errModelAbort
			}
			return nil
		})
		switch {
		case !ok:
			if !errors.Is(err, ErrNotFound) {
				return fmt.Errorf("update %s/%d: want ErrNotFound, got %v", mt.name, id, err)
			}
		case fail:
			if !errors.Is(err, errModelAbort) {
				return fmt.Errorf("update %s/%d: want the closure's error, got %v", mt.name, id, err)
			}
		case err != nil:
			return fmt.Errorf("update %s/%d: %w", mt.name, id, err)
		case seen != old:
			return fmt.Errorf("update %s/%d: closure saw value %d, want %d", mt.name, id, seen, old)
		default:
			m.set(ti, id, v, true)
		}
	case r < 85: // delete
		id := m.pickID(ti)
		_, ok := m.lookup(ti, id)
		err := ops.del(mt, id)
		if !ok {
			if !errors.Is(err, ErrNotFound) {
				return fmt.Errorf("delete %s/%d: want ErrNotFound, got %v", mt.name, id, err)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("delete %s/%d: %w", mt.name, id, err)
		}
		m.set(ti, id, 0, false)
	default: // scan
		var span uint64
		if inTx {
			span = 4 * 64
		}
		lo, hi := m.pickRange(ti, span)
		got, err := ops.scan(mt, lo, hi)
		if err != nil {
			return fmt.Errorf("scan %s [%d, %d): %w", mt.name, lo, hi, err)
		}
		if want := m.expectScan(ti, lo, hi); !slices.Equal(got, want) {
			return fmt.Errorf("scan %s [%d, %d): got %d rows %v, want %d rows %v", mt.name, lo, hi, len(got), head(got), len(want), head(want))
		}
	}
	return nil
}

func head(rs []modelRow) []modelRow { return rs[:min(len(rs), 8)] }

// verify compares every table with the model: a full scan (which checks every row's value)
// and a Get of a sample of rows (whole rows, checked word by word).
func (m *model) verify(ctx context.Context) {
	t := m.t
	t.Helper()
	for ti, mt := range m.tables {
		got, err := collectScan(mt.tb.Scan(ctx, 0, math.MaxUint64))
		require.NoError(t, err)
		require.Equal(t, m.expectScan(ti, 0, math.MaxUint64), got, "table %s", mt.name)
		buf := make([]byte, mt.rowBytes)
		for range min(len(mt.rows), 200) {
			id := m.pickID(ti)
			v, ok := mt.rows[id]
			err := mt.tb.Get(ctx, id, buf)
			if !ok {
				require.ErrorIs(t, err, ErrNotFound, "table %s row %d", mt.name, id)
				continue
			}
			require.NoError(t, err, "table %s row %d", mt.name, id)
			require.Equal(t, v, checkRow(t, buf), "table %s row %d", mt.name, id)
		}
	}
}

func (m *model) attach(ctx context.Context, db *DB, create bool) {
	for _, mt := range m.tables {
		var err error
		if create {
			mt.tb, err = db.CreateTable(ctx, mt.name, mt.rowBytes)
		} else {
			mt.tb, err = db.Table(ctx, mt.name)
		}
		require.NoError(m.t, err)
	}
}

func TestModel(t *testing.T) {
	steps, preload := 3000, map[int]int{8: 16000, 64: 8000, 520: 2000}
	if testing.Short() {
		steps, preload = 500, map[int]int{8: 2000, 64: 3000, 520: 1200}
	}
	for _, cfg := range openConfigs(t) {
		for _, cacheBytes := range []int64{1 << 20, 64 << 20} {
			t.Run(fmt.Sprintf("%s/cache=%dMiB", cfg.name, cacheBytes>>20), func(t *testing.T) {
				seed := modelSeed(t)
				t.Logf("seed %d (replay: WEFT_SEED=%d go test -run 'TestModel/%s')", seed, seed, t.Name()[len("TestModel/"):])
				modelRun(t, cfg, cacheBytes, seed, steps, preload)
			})
		}
	}
}

func modelRun(t *testing.T, cfg openConfig, cacheBytes int64, seed uint64, steps int, preload map[int]int) {
	ctx := context.Background()
	open := cfg.opener(t)
	opts := Options{CacheBytes: cacheBytes}
	db := open(opts)
	m := &model{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x5eed))}
	for _, r := range modelRowSizes {
		m.tables = append(m.tables, &modelTable{name: fmt.Sprintf("rows%d", r), rowBytes: r, rows: map[uint64]uint64{}})
	}
	m.attach(ctx, db, true)

	// Preload: big transactions, so the 1 MiB cache cannot hold the tables.
	for ti, mt := range m.tables {
		n := preload[mt.rowBytes]
		for done := 0; done < n; {
			k := min(n-done, 500)
			m.begin()
			var ids []uint64
			err := db.Update(ctx, func(tx *Tx) error {
				m.begin()
				ids = ids[:0]
				for range k {
					v := m.newValue()
					id, err := tx.Insert(mt.tb, u64Row(mt.rowBytes, v))
					if err != nil {
						return err
					}
					ids = append(ids, id)
					m.set(ti, id, v, true)
				}
				return nil
			})
			require.NoError(t, err)
			m.end(true)
			mt.ids = append(mt.ids, ids...)
			done += k
		}
	}
	m.verify(ctx)

	closedChecked := false
	for i := range steps {
		var err error
		switch r := m.rng.IntN(100); {
		case r < 55:
			err = m.step(tableOps{ctx}, false)
		case r < 80: // a multi-op transaction, committed or rolled back by its closure
			n := 1 + m.rng.IntN(6)
			abort := m.rng.IntN(5) == 0
			opSeed := m.rng.Uint64()
			outer := m.rng
			err = db.Update(ctx, func(tx *Tx) error {
				// The closure may run again: the same operations, the model's overlay anew.
				m.begin()
				m.rng = rand.New(rand.NewPCG(opSeed, 1))
				defer func() { m.rng = outer }()
				for range n {
					if err := m.step(txOps{tx}, true); err != nil {
						return err
					}
				}
				if abort {
					return errModelAbort
				}
				return nil
			})
			m.end(err == nil)
			if abort && errors.Is(err, errModelAbort) {
				err = nil
			}
		case r < 86: // a manual transaction
			tx, berr := db.Begin(ctx, true)
			require.NoError(t, berr)
			m.begin()
			n := 1 + m.rng.IntN(4)
			for range n {
				if err = m.step(txOps{tx}, true); err != nil {
					break
				}
			}
			if err == nil && m.rng.IntN(3) == 0 {
				tx.Rollback()
				require.ErrorIs(t, tx.Commit(), ErrTxDone)
				m.end(false)
			} else if err == nil {
				err = tx.Commit()
				m.end(err == nil)
			} else {
				tx.Rollback()
				m.end(false)
			}
		case r < 92: // read-only View
			err = db.View(ctx, func(tx *Tx) error {
				mt := m.tables[m.rng.IntN(len(m.tables))]
				buf := make([]byte, mt.rowBytes)
				id := m.pickID(slices.Index(m.tables, mt))
				gerr := tx.Get(mt.tb, id, buf)
				if gerr == nil {
					require.ErrorIs(t, tx.Put(mt.tb, id, buf), ErrReadOnly)
				}
				return nil
			})
		case r < 97: // asynchronous commits
			s := db.Session()
			var pend []*Pending
			for range 1 + m.rng.IntN(8) {
				ti := m.rng.IntN(len(m.tables))
				mt := m.tables[ti]
				v := m.newValue()
				var id uint64
				p := s.Go(ctx, func(tx *Tx) error {
					var err error
					id, err = tx.Insert(mt.tb, u64Row(mt.rowBytes, v))
					return err
				})
				require.NoError(t, p.err)
				mt.ids = append(mt.ids, id)
				m.set(ti, id, v, true)
				pend = append(pend, p)
			}
			err = s.Flush(ctx)
			for _, p := range pend {
				require.NoError(t, p.Wait(ctx))
			}
		default: // now and then: close and reopen
			if m.rng.IntN(8) != 0 {
				err = m.step(tableOps{ctx}, false)
				break
			}
			require.NoError(t, db.Close(ctx))
			if !closedChecked {
				closedChecked = true
				mt := m.tables[0]
				require.ErrorIs(t, mt.tb.Get(ctx, 0, make([]byte, mt.rowBytes)), ErrClosed)
				_, ierr := mt.tb.Insert(ctx, make([]byte, mt.rowBytes))
				require.ErrorIs(t, ierr, ErrClosed)
				require.ErrorIs(t, db.Update(ctx, func(*Tx) error { return nil }), ErrClosed)
			}
			db = open(opts)
			m.attach(ctx, db, false)
			m.verify(ctx)
		}
		require.NoError(t, err, "step %d (seed %d)", i, seed)
		if assert.Invariants {
			require.NoError(t, db.verify(), "step %d (seed %d)", i, seed)
		}
	}
	m.verify(ctx)
	require.NoError(t, db.Close(ctx))
	db = open(opts)
	m.attach(ctx, db, false)
	m.verify(ctx)
	st := db.Stats()
	t.Logf("%d steps; %d rows; stats after reopen %+v", steps, m.rows(), st)
}

func (m *model) rows() int {
	n := 0
	for _, mt := range m.tables {
		n += len(mt.rows)
	}
	return n
}

// TestModelConcurrent runs the model's operations from several goroutines. Each goroutine
// owns the rows it inserted and is the only one to write them, so it keeps an exact model of
// them; reads and scans cross owners. Checked: every read sees its owner's last committed
// value (own rows) or a well-formed row of its owner (others'), scans are ordered, and at the
// end the union of the models is the database.
func TestModelConcurrent(t *testing.T) {
	workers, steps := 16, 2000
	if testing.Short() {
		workers, steps = 4, 400
	}
	for _, cfg := range openConfigs(t) {
		t.Run(cfg.name, func(t *testing.T) {
			seed := modelSeed(t)
			t.Logf("seed %d", seed)
			ctx := context.Background()
			open := cfg.opener(t)
			opts := Options{CacheBytes: 128 << 10, CacheWait: 10 * time.Second} // ~27 frames: pages come and go
			db := open(opts)
			tb := newTable(t, ctx, db, "shared", 64)
			const ownerShift = 48 // row value: owner<<48 | counter
			models := make([]map[uint64]uint64, workers)
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				models[w] = map[uint64]uint64{}
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs <- concurrentWorker(ctx, db, tb, uint64(w), ownerShift, seed+uint64(w), steps, models[w])
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			all := map[uint64]uint64{}
			for _, mm := range models {
				maps.Copy(all, mm)
			}
			check := func(db *DB, tb *Table) {
				got := map[uint64]uint64{}
				for r, err := range tb.Scan(ctx, 0, math.MaxUint64) {
					require.NoError(t, err)
					got[r.ID] = checkRow(t, r.Data)
				}
				require.Equal(t, all, got)
			}
			check(db, tb)
			if assert.Invariants {
				require.NoError(t, db.verify())
			}
			require.NoError(t, db.Close(ctx))
			db = open(opts)
			tb = openTable(t, ctx, db, "shared")
			check(db, tb)
		})
	}
}

func concurrentWorker(ctx context.Context, db *DB, tb *Table, w uint64, ownerShift uint, seed uint64, steps int, own map[uint64]uint64) error {
	rng := rand.New(rand.NewPCG(seed, 7))
	counter := uint64(0)
	newValue := func() uint64 { counter++; return w<<ownerShift | counter }
	var ids []uint64 // own ids, rows or deleted
	buf := make([]byte, 64)
	checkForeign := func(id uint64, data []byte) error {
		v := binary.LittleEndian.Uint64(data)
		for off := 8; off+8 <= len(data); off += 8 {
			if binary.LittleEndian.Uint64(data[off:]) != v*0x9E3779B97F4A7C15^uint64(off) {
				return fmt.Errorf("row %d torn", id)
			}
		}
		if v>>ownerShift == w {
			if want, ok := own[id]; !ok || want != v {
				return fmt.Errorf("worker %d: own row %d reads %d, model has %d (present %v)", w, id, v, want, ok)
			}
		}
		return nil
	}
	for i := range steps {
		switch r := rng.IntN(100); {
		case r < 25 || len(ids) == 0: // insert, sometimes two in one transaction
			n := 1 + rng.IntN(2)
			vs := []uint64{newValue(), newValue()}
			var got []uint64
			err := db.Update(ctx, func(tx *Tx) error {
				got = got[:0]
				for k := range n {
					id, err := tx.Insert(tb, u64Row(64, vs[k]))
					if err != nil {
						return err
					}
					got = append(got, id)
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("worker %d step %d: insert: %w", w, i, err)
			}
			for k, id := range got {
				own[id] = vs[k]
				ids = append(ids, id)
			}
		case r < 50: // read-modify-write of two own rows and a read of whatever is around
			a, b := ids[rng.IntN(len(ids))], ids[rng.IntN(len(ids))]
			if a == b {
				continue
			}
			va, vb := newValue(), newValue()
			_, okA := own[a]
			_, okB := own[b]
			err := db.Update(ctx, func(tx *Tx) error {
				for _, x := range []struct {
					id uint64
					v  uint64
					ok bool
				}{{a, va, okA}, {b, vb, okB}} {
					err := tx.Update(tb, x.id, func(row []byte) error {
						if err := checkForeign(x.id, row); err != nil {
							return err
						}
						fillRow(row, x.v)
						return nil
					})
					if x.ok != (err == nil) {
						return fmt.Errorf("update own row %d: present %v, got %v", x.id, x.ok, err)
					}
				}
				near := a + uint64(rng.IntN(64)) - 32 // may wrap: far beyond every id
				if near == a || near == b {
					return nil // written above: reads this transaction's own value
				}
				if err := tx.Get(tb, near, buf); err == nil {
					return checkForeign(near, buf)
				} else if !errors.Is(err, ErrNotFound) {
					return err
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("worker %d step %d: update: %w", w, i, err)
			}
			if okA {
				own[a] = va
			}
			if okB {
				own[b] = vb
			}
		case r < 65: // delete an own row
			id := ids[rng.IntN(len(ids))]
			_, ok := own[id]
			err := tb.Delete(ctx, id)
			if ok != (err == nil) || (!ok && !errors.Is(err, ErrNotFound)) {
				return fmt.Errorf("worker %d step %d: delete own row %d (present %v): %v", w, i, id, ok, err)
			}
			delete(own, id)
		case r < 85: // serializable scan of a small range, then a row of it
			lo := ids[rng.IntN(len(ids))] &^ 63
			err := db.View(ctx, func(tx *Tx) error {
				last := uint64(0)
				first := true
				for r, err := range tx.Scan(tb, lo, lo+128) {
					if err != nil {
						return err
					}
					if !first && r.ID <= last {
						return fmt.Errorf("scan out of order: %d after %d", r.ID, last)
					}
					first, last = false, r.ID
					if err := checkForeign(r.ID, r.Data); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("worker %d step %d: scan: %w", w, i, err)
			}
		default: // plain reads of own rows
			id := ids[rng.IntN(len(ids))]
			want, ok := own[id]
			err := tb.Get(ctx, id, buf)
			if !ok {
				if !errors.Is(err, ErrNotFound) {
					return fmt.Errorf("worker %d step %d: get deleted own row %d: %v", w, i, id, err)
				}
				continue
			}
			if err != nil {
				return fmt.Errorf("worker %d step %d: get %d: %w", w, i, id, err)
			}
			if v := binary.LittleEndian.Uint64(buf); v != want {
				return fmt.Errorf("worker %d step %d: get own row %d: %d, want %d", w, i, id, v, want)
			}
		}
	}
	return nil
}
