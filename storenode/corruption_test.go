package storenode

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"path"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
)

// Corruption of durable data: disk pages (bit flips, a zeroed sector, a valid disk page of
// another logical page written at the wrong offset), the meta file and the WAL. Corrupt bytes
// are reported as corrupt.ErrCorruption, never returned as rows; rows the WAL and the cache
// still hold are served.

const corruptOwner = 9

// corruptStore is a store on a FaultFS with one 64-byte-row table whose pages 0..4 are full
// and checkpointed, reopened so that nothing is cached.
type corruptStore struct {
	fs    *vfs.FaultFS
	opts  Options
	e     *Engine
	table uint32
	epoch uint64
	seq   uint64
	rows  map[uint64][]byte
}

func newCorruptStore(t *testing.T) *corruptStore {
	fs := vfs.NewFaultFS()
	s := &corruptStore{fs: fs, opts: Options{Dir: "db", FS: fs, Logger: quietLogger}, rows: make(map[uint64][]byte)}
	var err error
	s.e, err = Open(s.opts)
	require.NoError(t, err)
	info, err := s.e.CreateTable("t", 64)
	require.NoError(t, err)
	s.table = info.ID
	s.acquire(t)
	for page := range uint64(5) {
		rows := make([]byte, 64*64)
		for slot := range uint64(64) {
			id := page*64 + slot
			fillRow(rows[slot*64:(slot+1)*64], s.table, id, 1)
			s.rows[id] = rows[slot*64 : (slot+1)*64]
		}
		s.commit(t, base.Segment{Table: s.table, Page: page, Data: ^uint64(0), Rows: rows})
	}
	require.NoError(t, s.e.Checkpoint())
	require.NoError(t, s.e.Close())
	s.e, err = Open(s.opts)
	require.NoError(t, err)
	s.acquire(t)
	t.Cleanup(func() { s.e.Close() })
	return s
}

func (s *corruptStore) acquire(t *testing.T) {
	g, err := s.e.Acquire(s.table, corruptOwner, 0)
	require.NoError(t, err)
	s.epoch, s.seq = g.Epoch, g.LastSeq
	requireGranted(t, s.e, s.table, corruptOwner, g.Epoch)
}

func (s *corruptStore) commit(t *testing.T, segs ...base.Segment) {
	s.seq++
	_, err := s.e.CommitWait(&base.Batch{Owner: corruptOwner, Seq: s.seq, Fences: []base.Fence{{Table: s.table, Epoch: s.epoch}}, Segments: segs})
	require.NoError(t, err)
}

// diskPage returns the disk page that holds a logical page in the published page map.
func (s *corruptStore) diskPage(t *testing.T, page uint64) int64 {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	ent := s.e.tables[s.table].entry(page)
	require.NotZero(t, ent.disk, "page %d has no disk page", page)
	return int64(ent.disk - 1)
}

// damage rewrites the table's data file through fn, as a bad disk would.
func (s *corruptStore) damage(t *testing.T, fn func(data []byte)) {
	name := dataFileName("db", s.table)
	data, err := s.fs.ReadFile(name)
	require.NoError(t, err)
	fn(data)
	require.NoError(t, s.fs.WriteFile(name, data))
}

// readPage reads the want rows of a page and checks them against the expected rows.
func (s *corruptStore) readPage(t *testing.T, page, want uint64) error {
	dst := []byte("dst")
	data, _, out, err := s.e.ReadRows(s.table, page, want, dst)
	if err != nil {
		require.Equal(t, dst, out, "a failed read returns no bytes")
		return err
	}
	require.Equal(t, want, data)
	out = out[len(dst):]
	k := 0
	for d := data; d != 0; d &= d - 1 {
		id := page*64 + uint64(bits.TrailingZeros64(d))
		require.Equal(t, s.rows[id], out[k*64:(k+1)*64], "row %d", id)
		k++
	}
	return nil
}

func TestCorruptDiskPages(t *testing.T) {
	s := newCorruptStore(t)
	const pageBytes = 4096
	disk := make(map[uint64]int64)
	for page := range uint64(5) {
		disk[page] = s.diskPage(t, page)
	}
	s.damage(t, func(data []byte) {
		data[disk[1]*pageBytes+1000] ^= 0x10                                 // page 1: one flipped bit
		clear(data[disk[2]*pageBytes+1536 : disk[2]*pageBytes+2048])         // page 2: a zeroed sector
		copy(data[disk[3]*pageBytes:], data[disk[0]*pageBytes:][:pageBytes]) // page 3: page 0's bytes
	})
	for _, page := range []uint64{1, 2, 3} {
		for range 2 { // never cached: the second read fails too
			err := s.readPage(t, page, ^uint64(0))
			require.ErrorIs(t, err, corrupt.ErrCorruption, "page %d", page)
			require.Contains(t, err.Error(), dataFileName("db", s.table))
			require.Contains(t, err.Error(), fmt.Sprintf("page %d: disk page %d", page, disk[page]))
		}
	}
	for _, page := range []uint64{0, 4} {
		require.NoError(t, s.readPage(t, page, ^uint64(0)))
	}

	// Rows written since the checkpoint sit in a partial frame: they are served from it, the
	// other rows of the page still need the disk copy, which is corrupt.
	fresh := make([]byte, 4*64)
	for slot := range uint64(4) {
		fillRow(fresh[slot*64:(slot+1)*64], s.table, 64+slot, 2)
		s.rows[64+slot] = fresh[slot*64 : (slot+1)*64]
	}
	s.commit(t, base.Segment{Table: s.table, Page: 1, Data: 0xf, Rows: fresh})
	require.NoError(t, s.readPage(t, 1, 0xf))
	require.ErrorIs(t, s.readPage(t, 1, 0x1f), corrupt.ErrCorruption)

	// After kill -9 the WAL replays them into a partial frame again.
	s.fs.SetCrashPoint(0)
	s.e.Close()
	s.fs.CrashKeepAll()
	var err error
	s.e, err = Open(s.opts)
	require.NoError(t, err)
	require.NoError(t, s.readPage(t, 1, 0xf))
	require.ErrorIs(t, s.readPage(t, 1, 1<<20), corrupt.ErrCorruption)
	require.NoError(t, s.readPage(t, 4, 0xff00))

	// A checkpoint must merge the partial frame with its disk copy, and cannot: it reports
	// the corruption (and the engine stops rather than publish a page it cannot vouch for).
	err = s.e.Checkpoint()
	require.ErrorIs(t, err, corrupt.ErrCorruption)
	require.ErrorIs(t, err, ErrFailStop)
}

func TestCorruptMetaFailsOpen(t *testing.T) {
	s := newCorruptStore(t)
	s.fs.SetCrashPoint(0)
	s.e.Close()
	s.fs.CrashKeepAll()
	name := path.Join("db", metaName)
	meta, err := s.fs.ReadFile(name)
	require.NoError(t, err)
	for _, off := range []int{0, 20, metaHeaderBytes + 3, len(meta) / 2, len(meta) - metaTrailerBytes} {
		bad := append([]byte(nil), meta...)
		bad[off] ^= 0x01
		require.NoError(t, s.fs.WriteFile(name, bad))
		_, err := Open(s.opts)
		require.ErrorIs(t, err, corrupt.ErrCorruption, "flipped byte %d", off)
		require.Contains(t, err.Error(), name)
	}
	require.NoError(t, s.fs.WriteFile(name, meta[:len(meta)-9]))
	_, err = Open(s.opts)
	require.ErrorIs(t, err, corrupt.ErrCorruption, "cut short")
	// The meta file gone while the WAL holds records is corruption too, not a new store.
	require.NoError(t, s.fs.Remove(name))
	_, err = Open(s.opts)
	require.ErrorIs(t, err, corrupt.ErrCorruption, "meta missing")
}

// walRecords returns the offsets of the records of a WAL segment, walking the length fields.
func walRecords(t *testing.T, seg []byte) []int {
	var offs []int
	for off := 32; off+32 <= len(seg); {
		n := int(binary.LittleEndian.Uint32(seg[off:]))
		if n == 0 && binary.LittleEndian.Uint64(seg[off+8:]) == 0 {
			break // zero header: end of the records
		}
		offs = append(offs, off)
		off += 32 + (n+7)&^7
	}
	require.NotEmpty(t, offs)
	return offs
}

func TestCorruptWALRecord(t *testing.T) {
	s := newCorruptStore(t)
	for i := range uint64(10) {
		row := make([]byte, 64)
		fillRow(row, s.table, 400+i, 3)
		s.commit(t, oneRow(s.table, 400+i, row))
	}
	s.fs.SetCrashPoint(0) // kill -9: the records stay after the checkpoint LSN
	s.e.Close()
	s.fs.CrashKeepAll()
	names, err := s.fs.List("db/wal")
	require.NoError(t, err)
	var segName string
	for _, n := range names {
		if path.Ext(n) == ".log" {
			segName = path.Join("db/wal", n)
		}
	}
	require.NotEmpty(t, segName)
	seg, err := s.fs.ReadFile(segName)
	require.NoError(t, err)
	offs := walRecords(t, seg)
	require.GreaterOrEqual(t, len(offs), 10)

	// A bad record in the middle: later records say it had been synced, so Open fails and
	// names the file and the offset.
	mid := offs[len(offs)/2]
	bad := append([]byte(nil), seg...)
	bad[mid+40] ^= 0x04
	require.NoError(t, s.fs.WriteFile(segName, bad))
	_, err = Open(s.opts)
	require.ErrorIs(t, err, corrupt.ErrCorruption)
	require.Contains(t, err.Error(), fmt.Sprintf("%s offset %d", segName, mid))
	// Nothing was changed: the same Open fails the same way.
	_, err2 := Open(s.opts)
	require.Equal(t, err.Error(), err2.Error())

	// A bad last record is indistinguishable from a torn write: it is dropped, with its batch.
	last := offs[len(offs)-1]
	bad = append([]byte(nil), seg...)
	bad[last+40] ^= 0x04
	require.NoError(t, s.fs.WriteFile(segName, bad))
	s.e, err = Open(s.opts)
	require.NoError(t, err)
	data, _, _, err := s.e.ReadRows(s.table, 409/64, 1<<(409%64), nil)
	require.NoError(t, err)
	require.Zero(t, data, "the torn last batch is not applied")
	data, _, _, err = s.e.ReadRows(s.table, 408/64, 1<<(408%64), nil)
	require.NoError(t, err)
	require.Equal(t, uint64(1)<<(408%64), data, "the batch before it is")
}
