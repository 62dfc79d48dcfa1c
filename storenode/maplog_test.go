package storenode

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
)

// mapLogTestMeta is the meta state the map log tests decode into: tables 1 and 2 live, 3
// dropped (its records are skipped).
func mapLogTestMeta() *metaState {
	return &metaState{ckptLSN: 1, syncedLSN: 1, nextTable: 4, owners: map[uint64]ownerState{}, version: metaVersion,
		tables: []metaTable{{id: 1, rowBytes: 64, name: "a"}, {id: 2, rowBytes: 64, name: "b"}}}
}

// randomEdit sets or clears n random entries of pm (near page 0, or near the table's last
// page: the map grows taller).
func randomEdit(rng *rand.Rand, pm *pageMap, n int) *pageMap {
	e := pm.edit()
	for range n {
		page := rng.Uint64N(4 * 64)
		if rng.IntN(8) == 0 {
			page = tablePagesMax - 1 - rng.Uint64N(128)
		}
		if rng.IntN(4) == 0 {
			e.set(page, mapEntry{})
		} else {
			e.set(page, mapEntry{disk: rng.Uint32N(1000) + 1, crc: rng.Uint32(), lsn: rng.Uint64N(100), present: rng.Uint64()})
		}
	}
	return e.seal()
}

func requireSameMap(t *testing.T, want, got *pageMap, msg string) {
	t.Helper()
	require.Equal(t, want.count(), got.count(), msg)
	require.Equal(t, want.leafCount(), got.leafCount(), msg)
	for page, ent := range want.all() {
		require.Equal(t, ent, got.get(page), "%s: page %d", msg, page)
	}
}

// A log of a compaction followed by checkpoints' deltas decodes to the latest maps, whatever
// the edits (entries set, replaced, cleared, leaves emptied, the map grown taller), and the
// deltas hold only what changed.
func TestMapLogDeltasDecodeToTheLatestMaps(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	m := mapLogTestMeta()
	m.tables[0].pages = randomEdit(rng, nil, 50)
	log := encodeMapLog(m, 1)
	logged := map[uint32]*pageMap{1: m.tables[0].pages, 2: nil}
	for round := range 200 {
		m.tables[0].pages = randomEdit(rng, m.tables[0].pages, 1+rng.IntN(6))
		m.tables[1].pages = randomEdit(rng, m.tables[1].pages, rng.IntN(3))
		before := len(log)
		log = appendMapLogDiff(log, m, logged)
		// At most one record per changed page (a record holds a leaf's changes).
		require.LessOrEqual(t, len(log)-before, 9*(mapLogRecordBytes+metaEntryBytes), "round %d", round)
		logged = map[uint32]*pageMap{1: m.tables[0].pages, 2: m.tables[1].pages}
		got := mapLogTestMeta()
		for i := range got.tables {
			got.tables[i].wantLeaves = uint64(m.tables[i].pages.leafCount())
			got.tables[i].wantEntries = uint64(m.tables[i].pages.count())
		}
		require.NoError(t, decodeMapLog(log, 1, got, true), "round %d", round)
		for i := range m.tables {
			requireSameMap(t, m.tables[i].pages, got.tables[i].pages, fmt.Sprintf("round %d", round))
			for page := range m.tables[i].pages.all() {
				off := got.tables[i].entryOff[page]
				require.Greater(t, off, int64(mapLogHeaderBytes), "entry offset of page %d", page)
			}
		}
	}
	// Nothing changed: nothing appended.
	require.Empty(t, appendMapLogDiff(nil, m, logged))
}

func mapLogSeeds() [][]byte {
	rng := rand.New(rand.NewPCG(3, 4))
	m := mapLogTestMeta()
	m.tables[0].pages = randomEdit(rng, nil, 20)
	log := encodeMapLog(m, 1)
	logged := map[uint32]*pageMap{1: m.tables[0].pages}
	m.tables[0].pages = randomEdit(rng, m.tables[0].pages, 5)
	m.tables[1].pages = randomEdit(rng, nil, 3)
	log = appendMapLogDiff(log, m, logged)
	// A record of the dropped table 3.
	log = appendMapLogRecord(log, 3, 0, 1, 0, []mapEntry{{disk: 1, lsn: 1}})
	return [][]byte{log, encodeMapLog(mapLogTestMeta(), 1)}
}

// FuzzDecodeMapLog: any bytes decode to maps or a corruption error, never a panic; what
// decodes re-encodes (compacted) to a log that decodes to the same maps.
func FuzzDecodeMapLog(f *testing.F) {
	for _, s := range mapLogSeeds() {
		f.Add(s)
		f.Add(s[:len(s)/2])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m := mapLogTestMeta()
		if err := applyMapLog(b, 1, m, true); err != nil {
			if !errors.Is(err, corrupt.ErrCorruption) {
				t.Fatalf("not a corruption error: %v", err)
			}
			return
		}
		again := mapLogTestMeta()
		for i := range again.tables {
			again.tables[i].wantLeaves = uint64(m.tables[i].pages.leafCount())
			again.tables[i].wantEntries = uint64(m.tables[i].pages.count())
			for page := range m.tables[i].pages.all() {
				if off := m.tables[i].entryOff[page]; off < mapLogHeaderBytes || off+metaEntryBytes > int64(len(b)) {
					t.Fatalf("page %d: entry offset %d in a log of %d bytes", page, off, len(b))
				}
			}
		}
		if err := decodeMapLog(encodeMapLog(m, 1), 1, again, false); err != nil {
			t.Fatalf("compacted log does not decode: %v", err)
		}
		for i := range m.tables {
			requireSameMap(t, m.tables[i].pages, again.tables[i].pages, "compacted")
		}
	})
}

// mapLogStore builds a store of one table with rows on several leaves, checkpointed twice (a
// compaction, then an append), and closed.
func mapLogStore(t *testing.T) (dir string, ids []uint64) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "store")
	opts := checkTestOptions(dir)
	e := openEngine(t, opts)
	info, g := ownedTable(t, e, "t", 64, testOwner, 300)
	seq := uint64(0)
	commit := func(id uint64) {
		seq++
		ch := make(chan error, 1)
		e.Commit(batchOf(testOwner, seq, info.ID, g.Epoch, oneRow(info.ID, id, row64(id))), func(_ uint64, err error) { ch <- err })
		require.NoError(t, <-ch)
	}
	ids = []uint64{0, 64 * 70, 64*64*3 + 5, 64 * 299}
	for _, id := range ids[:2] {
		commit(id)
	}
	require.NoError(t, e.Checkpoint())
	for _, id := range ids[2:] {
		commit(id)
	}
	require.NoError(t, e.Checkpoint())
	require.EqualValues(t, 1, e.stats.mapLogAppends.Load())
	require.EqualValues(t, 1, e.stats.mapLogCompactions.Load())
	require.NoError(t, e.Close())
	return dir, ids
}

func requireRows(t *testing.T, dir string, ids []uint64) {
	t.Helper()
	e := openEngine(t, checkTestOptions(dir))
	defer e.Close()
	for _, id := range ids {
		row, ok := readRow(t, e, 1, id)
		require.True(t, ok, "row %d", id)
		require.Equal(t, row64(id), row)
	}
}

// What an unpublished checkpoint leaves (a tail beyond the published length, a map log the
// meta file does not name) is noted by Check, not damage, and removed by Open.
func TestMapLogUnpublishedTailAndLogs(t *testing.T) {
	dir, ids := mapLogStore(t)
	m := loadTestMeta(t, dir)
	logName := filepath.Join(dir, mapLogName(m.logGen))
	f, err := os.OpenFile(logName, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.Write([]byte("a torn record of a checkpoint that was not published"))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	stray := filepath.Join(dir, mapLogName(m.logGen+1))
	writeTestFile(t, stray, []byte("WEFTMLOG half a compaction"))
	rep := runCheck(t, dir)
	require.Empty(t, damages(rep), "%v", rep.Findings)
	var noted []string
	for _, fd := range rep.Findings {
		if strings.HasPrefix(fd.File, mapLogPrefix) {
			noted = append(noted, fd.What)
		}
	}
	require.Len(t, noted, 2, "%v", rep.Findings)

	requireRows(t, dir, ids)
	_, err = os.Stat(stray)
	require.True(t, os.IsNotExist(err), "Open removed the unpublished log")
	fi, err := os.Stat(logName)
	require.NoError(t, err)
	require.EqualValues(t, m.logLen, fi.Size(), "Open truncated the unpublished tail")
	rep = runCheck(t, dir)
	require.Empty(t, rep.Findings)
}

// A damaged map log: a flipped byte in a record is damage at that record's offset in the map
// log (Check) and a corruption error (Open); so is a log cut below its published length, or
// missing.
func TestMapLogDamage(t *testing.T) {
	clean, _ := mapLogStore(t)
	m := loadTestMeta(t, clean)
	name := mapLogName(m.logGen)
	// Page 0's record (of the compaction): a byte of its set mask, of its first entry.
	off := m.tables[0].entryOff[0] - (mapLogRecordBytes - 8)
	for _, at := range []int64{off + 9, off + mapLogRecordBytes} {
		dir := copyStore(t, clean)
		flipByte(t, filepath.Join(dir, name), at)
		rep := runCheck(t, dir)
		requireOnly(t, rep, Finding{Damage: true, File: name, Offset: off, Page: -1, DiskPage: -1}, "checksum", "cannot be checked")
		// The finding's offset is in its File/Offset, not said again in its text.
		require.NotContains(t, damages(rep)[0].What, fmt.Sprintf("offset %d", off))
		_, err := Open(checkTestOptions(dir))
		require.ErrorIs(t, err, corrupt.ErrCorruption)
	}
	dir := copyStore(t, clean)
	require.NoError(t, os.Truncate(filepath.Join(dir, name), int64(m.logLen)-1))
	rep := runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: name, Offset: -1, Page: -1, DiskPage: -1}, "published")
	_, err := Open(checkTestOptions(dir))
	require.ErrorIs(t, err, corrupt.ErrCorruption)

	dir = copyStore(t, clean)
	require.NoError(t, os.Remove(filepath.Join(dir, name)))
	rep = runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: name, Offset: -1, Page: -1, DiskPage: -1}, "missing")
	_, err = Open(checkTestOptions(dir))
	require.ErrorIs(t, err, corrupt.ErrCorruption)
}

// A store whose meta file is version 3 (the page map inside it) checks clean, opens with every
// row, and the next checkpoint upgrades it to version 4 with a map log.
func TestSparseMetaStoreOpensAndUpgrades(t *testing.T) {
	dir, ids := mapLogStore(t)
	m := loadTestMeta(t, dir)
	require.NoError(t, os.Remove(filepath.Join(dir, mapLogName(m.logGen))))
	writeTestFile(t, filepath.Join(dir, metaName), encodeSparseMeta(m))
	requireCheckNoDamage(t, vfs.Default, dir, "version-3 store")
	requireRows(t, dir, ids)
	e := openEngine(t, checkTestOptions(dir))
	g := acquire(t, e, 1, testOwner, 0)
	ch := make(chan error, 1)
	e.Commit(batchOf(testOwner, g.LastSeq+1, 1, g.Epoch, oneRow(1, 7, row64(7))), func(_ uint64, err error) { ch <- err })
	require.NoError(t, <-ch)
	require.NoError(t, e.Checkpoint())
	require.NoError(t, e.Close())
	m = loadTestMeta(t, dir)
	require.EqualValues(t, metaVersion, m.version)
	require.NotZero(t, m.logGen)
	requireCheckNoDamage(t, vfs.Default, dir, "upgraded store")
	requireRows(t, dir, append(ids, 7))
}

// precheckMapLog passes a good log whose records cross its read chunks, and finds a flipped
// byte at the offset applyMapLog reports.
func TestPrecheckMapLogChunks(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	m := mapLogTestMeta()
	m.tables[0].pages = randomEdit(rng, nil, 400)
	log := encodeMapLog(m, 1)
	logged := map[uint32]*pageMap{1: m.tables[0].pages}
	for range 20 {
		m.tables[0].pages = randomEdit(rng, m.tables[0].pages, 10)
		log = appendMapLogDiff(log, m, logged)
		logged = map[uint32]*pageMap{1: m.tables[0].pages}
	}
	require.Greater(t, len(log), 4*mapLogRecordBytesMax)
	ffs := vfs.NewFaultFS()
	require.NoError(t, ffs.WriteFile("log", log))
	f, err := ffs.Open("log")
	require.NoError(t, err)
	defer f.Close()
	for _, chunk := range []int{mapLogRecordBytesMax, mapLogRecordBytesMax + 7, 3 * mapLogRecordBytesMax, mapLogStreamChunk} {
		require.NoError(t, precheckMapLog(f, 1, int64(len(log)), chunk), "chunk %d", chunk)
	}
	require.ErrorIs(t, precheckMapLog(f, 2, int64(len(log)), mapLogRecordBytesMax), corrupt.ErrCorruption, "another generation")
	require.ErrorIs(t, precheckMapLog(f, 1, int64(len(log))+1, mapLogRecordBytesMax), corrupt.ErrCorruption, "beyond the file")

	bad := append([]byte(nil), log...)
	at := len(log) - 10
	bad[at] ^= 1
	require.NoError(t, ffs.WriteFile("bad", bad))
	bf, err := ffs.Open("bad")
	require.NoError(t, err)
	defer bf.Close()
	want := applyMapLog(bad, 1, mapLogTestMeta(), false)
	require.Error(t, want)
	got := precheckMapLog(bf, 1, int64(len(bad)), mapLogRecordBytesMax+7)
	var dw, dg *mapLogDamage
	require.ErrorAs(t, want, &dw)
	require.ErrorAs(t, got, &dg)
	require.Equal(t, dw.off, dg.off)
}

// FuzzPrecheckMapLog: the streamed check of a map log never panics, fails only with a
// corruption error, passes every log applyMapLog decodes and, where it fails, fails at or
// after the offset applyMapLog reports (it checks sizes and checksums, not fields), whatever
// the read chunk.
func FuzzPrecheckMapLog(f *testing.F) {
	for _, s := range mapLogSeeds() {
		f.Add(s, uint16(0))
		f.Add(s[:len(s)-3], uint16(100))
	}
	f.Fuzz(func(t *testing.T, b []byte, extra uint16) {
		ffs := vfs.NewFaultFS()
		require.NoError(t, ffs.WriteFile("log", b))
		lf, err := ffs.Open("log")
		require.NoError(t, err)
		defer lf.Close()
		got := precheckMapLog(lf, 1, int64(len(b)), mapLogRecordBytesMax+int(extra))
		if got != nil && !errors.Is(got, corrupt.ErrCorruption) {
			t.Fatalf("not a corruption error: %v", got)
		}
		want := applyMapLog(b, 1, mapLogTestMeta(), false)
		if want == nil {
			require.NoError(t, got)
			return
		}
		if got != nil {
			var dw, dg *mapLogDamage
			require.ErrorAs(t, want, &dw)
			require.ErrorAs(t, got, &dg)
			require.GreaterOrEqual(t, dg.off, dw.off, "want %v, got %v", want, got)
		}
	})
}
