package storenode

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"log/slog"
	"maps"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
)

// The shared harness of the reliability tests (crash, power loss, crash points, fail-stop,
// model): a map model of the tables, a checker that compares an engine with it through the
// public reads (PageDir and ReadRows, so the bitmap-trees, the page maps, the cache and the data
// files are all on the path), and a generator of random commit batches.
//
// Environment:
//
//	WEFT_SOAK=1         raises every randomised suite's counts (kill cycles, power-loss seeds,
//	                    model steps) for a soak run; see testseed.Scaled.
//	WEFT_SEED=<n>       replays one seed of the power-loss and model suites, or the random
//	                    choices of the kill -9 suite (each prints its seed).

// quietLogger drops the engine's logs: fail-stop is expected in these tests.
var quietLogger = slog.New(slog.DiscardHandler)

// modelTable is the expected content of one table.
type modelTable struct {
	id       uint32
	rowBytes int
	rows     map[uint64][]byte // row id -> bytes; absent rows are not in the map
}

// storeModel is the expected content of a store: its tables by id.
type storeModel struct {
	tables map[uint32]*modelTable
}

func newStoreModel() *storeModel { return &storeModel{tables: make(map[uint32]*modelTable)} }

func (m *storeModel) addTable(id uint32, rowBytes int) *modelTable {
	mt := &modelTable{id: id, rowBytes: rowBytes, rows: make(map[uint64][]byte)}
	m.tables[id] = mt
	return mt
}

func (m *storeModel) clone() *storeModel {
	c := newStoreModel()
	for id, mt := range m.tables {
		c.tables[id] = &modelTable{id: id, rowBytes: mt.rowBytes, rows: maps.Clone(mt.rows)}
	}
	return c
}

// apply applies a batch the way the engine must: data rows take their bytes, clear rows go.
// Row slices are shared with the batch, which the tests never change after building it.
func (m *storeModel) apply(b *base.Batch) {
	for i := range b.Segments {
		s := &b.Segments[i]
		mt := m.tables[s.Table]
		if mt == nil {
			continue // a table dropped since
		}
		r := mt.rowBytes
		base := s.Page * logicpage.RowsPerPage
		k := 0
		for d := s.Data; d != 0; d &= d - 1 {
			slot := uint64(bits.TrailingZeros64(d))
			mt.rows[base+slot] = s.Rows[k*r : (k+1)*r]
			k++
		}
		for c := s.Clear; c != 0; c &= c - 1 {
			delete(mt.rows, base+uint64(bits.TrailingZeros64(c)))
		}
	}
}

// pages returns the model's present mask of every page that holds rows.
func (mt *modelTable) pages() map[uint64]uint64 {
	out := make(map[uint64]uint64)
	for id := range mt.rows {
		out[id/logicpage.RowsPerPage] |= 1 << (id % logicpage.RowsPerPage)
	}
	return out
}

// pageDir lists every page of a table that holds rows, through PageDir in small steps so
// continuation is exercised too.
func pageDir(e *Engine, table uint32) (map[uint64]uint64, error) {
	out := make(map[uint64]uint64)
	var buf []PageInfo
	for lo := uint64(0); lo < tablePagesMax; {
		var next uint64
		var err error
		buf, next, err = e.PageDir(table, lo, tablePagesMax, 7, buf[:0])
		if err != nil {
			return nil, err
		}
		for _, p := range buf {
			if p.Present == 0 {
				return nil, fmt.Errorf("table %d: PageDir lists page %d with no rows", table, p.Page)
			}
			if _, dup := out[p.Page]; dup || p.Page < lo {
				return nil, fmt.Errorf("table %d: PageDir lists page %d twice or out of order", table, p.Page)
			}
			out[p.Page] = p.Present
		}
		if next <= lo && len(buf) == 0 {
			return nil, fmt.Errorf("table %d: PageDir from %d made no progress", table, lo)
		}
		lo = next
	}
	return out, nil
}

// checkTable compares one table of e with mt: its row size and row count, its page directory
// and the bytes of every present row; a read of absent rows must report them clear.
func checkTable(e *Engine, mt *modelTable) error {
	var info base.TableInfo
	found := false
	for _, ti := range e.Tables() {
		if ti.ID == mt.id {
			info, found = ti, true
		}
	}
	if !found {
		return fmt.Errorf("table %d is missing", mt.id)
	}
	if info.RowBytes != mt.rowBytes {
		return fmt.Errorf("table %d: row size %d, want %d", mt.id, info.RowBytes, mt.rowBytes)
	}
	want := mt.pages()
	got, err := pageDir(e, mt.id)
	if err != nil {
		return err
	}
	for _, page := range slices.Sorted(maps.Keys(want)) {
		if got[page] != want[page] {
			return fmt.Errorf("table %d page %d: present %#016x, want %#016x", mt.id, page, got[page], want[page])
		}
	}
	for page, mask := range got {
		if _, ok := want[page]; !ok {
			return fmt.Errorf("table %d page %d: present %#016x, want no rows", mt.id, page, mask)
		}
	}
	if info.Rows != uint64(len(mt.rows)) {
		return fmt.Errorf("table %d: %d rows, want %d", mt.id, info.Rows, len(mt.rows))
	}
	var out []byte
	for _, page := range slices.Sorted(maps.Keys(want)) {
		mask := want[page]
		data, clr, rows, err := e.ReadRows(mt.id, page, ^uint64(0), out[:0])
		if err != nil {
			return fmt.Errorf("table %d page %d: %w", mt.id, page, err)
		}
		out = rows
		if data != mask || clr != ^mask {
			return fmt.Errorf("table %d page %d: read data %#016x clear %#016x, want data %#016x", mt.id, page, data, clr, mask)
		}
		r := mt.rowBytes
		k := 0
		for d := mask; d != 0; d &= d - 1 {
			id := page*logicpage.RowsPerPage + uint64(bits.TrailingZeros64(d))
			if got := rows[k*r : (k+1)*r]; !bytes.Equal(got, mt.rows[id]) {
				return fmt.Errorf("table %d row %d: read %x, want %x", mt.id, id, got[:min(r, 16)], mt.rows[id][:min(r, 16)])
			}
			k++
		}
	}
	return nil
}

// checkStore compares every table of m with e. Tables of e that m does not know are allowed
// (a creation that was not acknowledged may or may not have survived), if they are empty.
func checkStore(e *Engine, m *storeModel) error {
	for _, id := range slices.Sorted(maps.Keys(m.tables)) {
		if err := checkTable(e, m.tables[id]); err != nil {
			return err
		}
	}
	for _, ti := range e.Tables() {
		if _, ok := m.tables[ti.ID]; !ok && ti.Rows != 0 {
			return fmt.Errorf("unexpected table %d (%s) holds %d rows", ti.ID, ti.Name, ti.Rows)
		}
	}
	return nil
}

// fillRow fills dst with the row image of (table, id, version): a function of the three, so a
// misplaced or stale row never matches by accident.
func fillRow(dst []byte, table uint32, id, version uint64) {
	x := uint64(table)<<48 ^ id<<20 ^ version
	for i := 0; i < len(dst); i += 8 {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(dst[i:], z^z>>31)
	}
}

// batchGen builds random commit batches: inserts, updates and deletes over a window of pages
// of each table, several pages per batch, sometimes several tables.
type batchGen struct {
	rng     *rand.Rand
	pages   uint64 // page window: pages [0, pages) of each table
	segsMax int    // segments per batch, at most
	version uint64
}

// next returns a batch of owner with seq over tables (each with its fence epoch).
func (g *batchGen) next(owner, seq uint64, tables []*modelTable, epochs map[uint32]uint64) *base.Batch {
	b := &base.Batch{Owner: owner, Seq: seq}
	nSegs := 1 + g.rng.IntN(g.segsMax)
	seen := make(map[uint64]bool)
	for range nSegs {
		mt := tables[g.rng.IntN(len(tables))]
		page := g.rng.Uint64N(g.pages)
		if seen[frameKey(mt.id, page)] {
			continue
		}
		seen[frameKey(mt.id, page)] = true
		if !fenced(b.Fences, mt.id) {
			b.Fences = append(b.Fences, base.Fence{Table: mt.id, Epoch: epochs[mt.id]})
		}
		var data, clr uint64
		switch g.rng.IntN(4) {
		case 0: // a whole page
			data = ^uint64(0)
		case 1: // a few rows
			for range 1 + g.rng.IntN(4) {
				data |= 1 << g.rng.IntN(64)
			}
		case 2: // deletes and writes
			data = g.rng.Uint64() & g.rng.Uint64()
			clr = g.rng.Uint64() &^ data & g.rng.Uint64()
		default: // a run
			lo := g.rng.IntN(64)
			n := 1 + g.rng.IntN(64-lo)
			data = (uint64(1)<<n - 1) << lo
			if n == 64 {
				data = ^uint64(0)
			}
		}
		if data == 0 && clr == 0 {
			data = 1
		}
		rows := make([]byte, bits.OnesCount64(data)*mt.rowBytes)
		k := 0
		g.version++
		for d := data; d != 0; d &= d - 1 {
			id := page*logicpage.RowsPerPage + uint64(bits.TrailingZeros64(d))
			fillRow(rows[k*mt.rowBytes:(k+1)*mt.rowBytes], mt.id, id, g.version)
			k++
		}
		b.Segments = append(b.Segments, base.Segment{Table: mt.id, Page: page, Data: data, Clear: clr, Rows: rows})
	}
	return b
}

// testGrantPages is how many id pages the tests grant a table before they write it: the batch
// generators' page windows lie below it.
const testGrantPages = 64

// grantPages makes sure the ids of table's first pages pages are granted, as a transaction
// node does before it inserts (the engine refuses rows never granted), and returns the table's
// next id. Grants are whole pages, so the next id is a page boundary.
func grantPages(e *Engine, table uint32, owner, epoch uint64, pages int) (uint64, error) {
	for _, ti := range e.Tables() {
		if ti.ID != table {
			continue
		}
		want := uint64(pages) * logicpage.RowsPerPage
		if ti.NextID >= want {
			return ti.NextID, nil
		}
		first, n, err := e.AllocIDs(table, owner, epoch, int((want-ti.NextID)/logicpage.RowsPerPage))
		return first + n, err
	}
	return 0, fmt.Errorf("table %d missing", table)
}

// requireGranted is grantPages of testGrantPages pages that fails the test on error.
func requireGranted(t testing.TB, e *Engine, table uint32, owner, epoch uint64) uint64 {
	t.Helper()
	next, err := grantPages(e, table, owner, epoch, testGrantPages)
	require.NoError(t, err)
	return next
}
