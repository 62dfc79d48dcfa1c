package storenode

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/storenode/wal"
)

// The verify-of-damaged-store suite: a real store (commits, a checkpoint, more commits) is
// stopped, each kind of file is damaged in turn, and Check must report exactly that damage,
// leave every byte of the directory as it was, and pass the undamaged store.

const checkOwner = 7

// checkStore is a store built for the suite: clean is a closed store (its final checkpoint
// covers everything), crash is a copy taken while it ran after its second phase of commits
// (what kill -9 leaves: the WAL holds records after the checkpoint's synced LSN).
type checkStores struct {
	clean, crash string
	ckptLSN      uint64 // the crash copy's checkpoint LSN
	lastLSN      uint64 // the crash copy's last WAL record
}

// requireChecked runs Check on dir, failing the test on error, and returns its report.
func requireChecked(t testing.TB, ctx context.Context, dir string, opts CheckOptions) *CheckReport {
	t.Helper()
	rep, err := Check(ctx, dir, opts)
	require.NoError(t, err)
	return rep
}

func checkTestOptions(dir string) Options {
	return Options{Dir: dir, CheckpointWALBytes: -1, CheckpointInterval: -1, Logger: quietLogger, ExpireLeasesAtOpen: true}
}

// checkRows returns n rows of r bytes, distinct per (page, version).
func checkRows(n, r int, page, version uint64) []byte {
	b := make([]byte, n*r)
	for i := range b {
		b[i] = byte(uint64(i)*31 + page*7 + version + 1)
	}
	return b
}

func buildCheckStores(t *testing.T) checkStores {
	t.Helper()
	dir := t.TempDir()
	s := checkStores{clean: filepath.Join(dir, "clean"), crash: filepath.Join(dir, "crash")}
	e := openEngine(t, checkTestOptions(s.clean))
	items, err := e.CreateTable("items", 64)
	require.NoError(t, err)
	wide, err := e.CreateTable("wide", 136) // 64*136 bytes of rows in a 12 KiB disk page: padding
	require.NoError(t, err)
	seq := uint64(0)
	epochs := map[uint32]uint64{}
	for _, id := range []uint32{items.ID, wide.ID} {
		g := acquire(t, e, id, checkOwner, 0)
		epochs[id] = g.Epoch
		_, _, err = e.AllocIDs(id, checkOwner, g.Epoch, 8)
		require.NoError(t, err)
	}
	commit := func(table uint32, rowBytes int, page, data, clear, version uint64) {
		t.Helper()
		seq++
		b := &base.Batch{Owner: checkOwner, Seq: seq, Fences: []base.Fence{{Table: table, Epoch: epochs[table]}},
			Segments: []base.Segment{{Table: table, Page: page, Data: data, Clear: clear,
				Rows: checkRows(popcount(data), rowBytes, page, version)}}}
		commitWait(t, e, b)
	}
	for p := uint64(0); p < 6; p++ {
		commit(items.ID, 64, p, ^uint64(0), 0, 1)
	}
	commit(items.ID, 64, 2, 0, 0xff00, 2) // deletes: absent slots are zero on disk
	for p := uint64(0); p < 3; p++ {
		commit(wide.ID, 136, p, 0x0f0f0f0f0f0f0f0f, 0, 1)
	}
	require.NoError(t, e.Checkpoint())
	for p := uint64(1); p < 8; p++ {
		commit(items.ID, 64, p, 0x00ff00ff00ff00ff, 0, 3)
	}
	commit(wide.ID, 136, 1, 1, 0, 4)
	e.mu.Lock()
	s.ckptLSN, s.lastLSN = e.ckptLSN, e.lastLSN
	e.mu.Unlock()
	require.NoError(t, os.CopyFS(s.crash, os.DirFS(s.clean))) // nothing runs: a kill -9 image
	require.NoError(t, e.Close())
	require.Greater(t, s.lastLSN, s.ckptLSN+2)
	return s
}

func popcount(m uint64) int {
	n := 0
	for ; m != 0; m &= m - 1 {
		n++
	}
	return n
}

// copyStore returns a fresh copy of the store in dir.
func copyStore(t *testing.T, dir string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "store")
	require.NoError(t, os.CopyFS(dst, os.DirFS(dir)))
	return dst
}

// treeOf returns every file of dir with its bytes and mode.
func treeOf(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		info, err := d.Info()
		require.NoError(t, err)
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			out[rel+"/"] = info.Mode().String()
			return nil
		}
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		out[rel] = info.Mode().String() + " " + info.ModTime().String() + " " + string(b)
		return nil
	}))
	return out
}

// runCheck checks dir, requiring that the check changed nothing.
func runCheck(t *testing.T, dir string) *CheckReport {
	t.Helper()
	before := treeOf(t, dir)
	rep := requireChecked(t, context.Background(), dir, CheckOptions{})
	require.Equal(t, before, treeOf(t, dir), "Check changed the directory")
	return rep
}

// damages returns the damage findings of rep.
func damages(rep *CheckReport) []Finding {
	var out []Finding
	for _, f := range rep.Findings {
		if f.Damage {
			out = append(out, f)
		}
	}
	return out
}

// requireOnly requires that rep holds exactly one damage finding, want, whose What contains
// every one of whats; want.What is ignored.
func requireOnly(t *testing.T, rep *CheckReport, want Finding, whats ...string) {
	t.Helper()
	d := damages(rep)
	require.Len(t, d, 1, "%v", rep.Findings)
	requireFinding(t, d[0], want, whats...)
}

func requireFinding(t *testing.T, got, want Finding, whats ...string) {
	t.Helper()
	what := got.What
	got.What, want.What = "", ""
	require.Equal(t, want, got, what)
	for _, w := range whats {
		require.Contains(t, what, w)
	}
}

// editMeta decodes dir's meta file, lets edit change it, and writes it back re-sealed (a
// valid checksum): damage a buggy writer, not bit rot, would leave.
func editMeta(t *testing.T, dir string, edit func(m *metaState)) {
	t.Helper()
	m := loadTestMeta(t, dir)
	edit(m)
	writeTestMeta(t, dir, m)
}

// writeTestMeta writes m as dir's meta file and its page maps as a fresh map log of m's
// generation (1 when m has none), both sealed.
func writeTestMeta(t *testing.T, dir string, m *metaState) {
	t.Helper()
	m.version = metaVersion
	if m.logGen == 0 {
		m.logGen = 1
	}
	lb := encodeMapLog(m, m.logGen)
	m.logLen = uint64(len(lb))
	writeTestFile(t, filepath.Join(dir, mapLogName(m.logGen)), lb)
	writeTestFile(t, filepath.Join(dir, metaName), encodeMeta(m))
}

// writeTestFile replaces a file's bytes.
func writeTestFile(t *testing.T, name string, b []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(name, b, 0o644))
}

func flipByte(t *testing.T, name string, off int64) {
	t.Helper()
	b, err := os.ReadFile(name)
	require.NoError(t, err)
	b[off] ^= 0x20
	writeTestFile(t, name, b)
}

// entryFile and entryOff return the file and offset of the page-map entry of page of dir's
// table i (its map log's last record of the leaf, or the meta file's entry).
func entryFile(t *testing.T, dir string, i int) string {
	t.Helper()
	return metaEntryFile(&loadTestMeta(t, dir).tables[i])
}

func entryOff(t *testing.T, dir string, i int, page uint64) int64 {
	t.Helper()
	m := loadTestMeta(t, dir)
	return metaEntryOffset(&m.tables[i], metaTableOffsets(m)[i], page)
}

func loadTestMeta(t *testing.T, dir string) *metaState {
	t.Helper()
	m, ok, err := loadMetaOffsets(vfs.Default, dir, true)
	require.NoError(t, err)
	require.True(t, ok)
	return m
}

// walRecordOffsets returns the offset of every record of the one WAL segment in dir, by LSN.
func walRecordOffsets(t *testing.T, dir string) (file string, offs map[uint64]int64) {
	t.Helper()
	names, err := os.ReadDir(filepath.Join(dir, "wal"))
	require.NoError(t, err)
	var segs []string
	for _, n := range names {
		if strings.HasSuffix(n.Name(), ".log") {
			segs = append(segs, n.Name())
		}
	}
	require.Len(t, segs, 1)
	file = filepath.Join("wal", segs[0])
	b, err := os.ReadFile(filepath.Join(dir, file))
	require.NoError(t, err)
	offs = map[uint64]int64{}
	for off := 32; off+32 <= len(b); {
		n := int(binary.LittleEndian.Uint32(b[off:]))
		lsn := binary.LittleEndian.Uint64(b[off+8:])
		if lsn == 0 {
			break
		}
		offs[lsn] = int64(off)
		off += 32 + (n+7)&^7
	}
	return file, offs
}

func TestCheckCleanStores(t *testing.T) {
	s := buildCheckStores(t)
	for _, dir := range []string{s.clean, s.crash} {
		rep := runCheck(t, dir)
		require.False(t, rep.Damaged(), "%v", rep.Findings)
		require.Empty(t, rep.Findings)
		require.Equal(t, 2, rep.Tables)
		require.Positive(t, rep.Pages)
		require.Positive(t, rep.WALRecords)
		require.Equal(t, 1, rep.WALSegments)
		require.Equal(t, s.lastLSN, rep.LastLSN)
	}
	rep := runCheck(t, s.crash)
	require.Equal(t, s.ckptLSN, rep.CheckpointLSN)
	require.EqualValues(t, 6+3, rep.Pages, "the pages of the first checkpoint")
	require.EqualValues(t, 6*64-8+3*32, rep.Rows)
	require.Zero(t, rep.FreeDiskPages)
	rep = runCheck(t, s.clean)
	require.EqualValues(t, 8+3, rep.Pages, "pages 6 and 7 of items joined at Close")
	require.EqualValues(t, 6, rep.FreeDiskPages, "the old copies of items pages 1..5 and wide page 1, rewritten at Close")

	// The store opens, and checks clean again after recovery made it its own.
	e := openEngine(t, checkTestOptions(copyStore(t, s.crash)))
	dir := e.dir
	require.NoError(t, e.Close())
	rep = runCheck(t, dir)
	require.False(t, rep.Damaged(), "%v", rep.Findings)
}

func TestCheckRefusesRunningStore(t *testing.T) {
	s := buildCheckStores(t)
	dir := copyStore(t, s.clean)
	e := openEngine(t, checkTestOptions(dir))
	_, err := Check(context.Background(), dir, CheckOptions{})
	require.ErrorIs(t, err, ErrLocked)
	require.ErrorContains(t, err, "stop it before checking")
	// An Engine of this process holds it: the error says so, never "another process"
	// (fails on 71787ea: ErrLocked's "locked by another process").
	require.ErrorIs(t, err, ErrAlreadyOpen)
	require.NotContains(t, err.Error(), "another process")

	require.NoError(t, e.Close())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = Check(ctx, dir, CheckOptions{})
	require.ErrorIs(t, err, context.Canceled)

	_, err = Check(context.Background(), filepath.Join(t.TempDir(), "nothing"), CheckOptions{})
	require.ErrorIs(t, err, ErrNotStore)
	_, err = Check(context.Background(), t.TempDir(), CheckOptions{})
	require.ErrorIs(t, err, ErrNotStore)
	require.ErrorContains(t, err, "not a Weft store")
}

func TestCheckMetaDamage(t *testing.T) {
	s := buildCheckStores(t)
	size := func(dir string) int64 {
		info, err := os.Stat(filepath.Join(dir, metaName))
		require.NoError(t, err)
		return info.Size()
	}
	// A flipped byte anywhere: in the header, in a page-map entry, in the checksum itself.
	m := loadTestMeta(t, s.clean)
	entryOff := metaEntryOffset(&m.tables[0], metaTableOffsets(m)[0], 3)
	for _, off := range []int64{20, entryOff + 5, size(s.clean) - 8} {
		dir := copyStore(t, s.clean)
		flipByte(t, filepath.Join(dir, metaName), off)
		rep := runCheck(t, dir)
		requireOnly(t, rep, Finding{Damage: true, File: metaName, Offset: -1, Page: -1, DiskPage: -1},
			fmt.Sprintf("offset %d: checksum", size(dir)-8), "cannot be checked")
	}
	// Cut short.
	dir := copyStore(t, s.clean)
	require.NoError(t, os.Truncate(filepath.Join(dir, metaName), size(dir)-100))
	rep := runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: metaName, Offset: -1, Page: -1, DiskPage: -1}, "checksum")
	// Missing while the WAL holds records.
	dir = copyStore(t, s.clean)
	require.NoError(t, os.Remove(filepath.Join(dir, metaName)))
	rep = runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: metaName, Offset: -1, Page: -1, DiskPage: -1}, "missing but the WAL holds records")
}

func TestCheckDataPageDamage(t *testing.T) {
	s := buildCheckStores(t)
	m := loadTestMeta(t, s.clean)
	items := &m.tables[0]
	offs := metaTableOffsets(m)
	const page = 4
	ent := items.pages.get(page)
	d := int64(ent.disk - 1)
	dataFile := "table-00000001.dat"

	// A flipped byte in the page.
	dir := copyStore(t, s.clean)
	flipByte(t, filepath.Join(dir, dataFile), d*4096+100)
	b, err := os.ReadFile(filepath.Join(dir, dataFile))
	require.NoError(t, err)
	found := checksum.Of(b[d*4096 : (d+1)*4096])
	rep := runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: dataFile, Offset: d * 4096, Table: 1, Page: page, DiskPage: d},
		fmt.Sprintf("checksum %#08x, the page-map entry (%s offset %d) says %#08x", found, metaEntryFile(items), metaEntryOffset(items, offs[0], page), ent.crc))

	// A page-map entry whose checksum is wrong (re-sealed meta: a writer's bug).
	dir = copyStore(t, s.clean)
	editMeta(t, dir, func(m *metaState) { editEntry(&m.tables[0].pages, page, func(e *mapEntry) { e.crc ^= 1 }) })
	rep = runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: dataFile, Offset: d * 4096, Table: 1, Page: page, DiskPage: d},
		fmt.Sprintf("checksum %#08x, the page-map entry (%s offset %d) says %#08x", ent.crc, entryFile(t, dir, 0), entryOff(t, dir, 0, page), ent.crc^1))

	// The data file truncated: the last mapped page is gone.
	dir = copyStore(t, s.clean)
	last, lastPage := int64(-1), uint64(0)
	for p, e := range items.pages.all() {
		if int64(e.disk)-1 > last {
			last, lastPage = int64(e.disk)-1, p
		}
	}
	require.NoError(t, os.Truncate(filepath.Join(dir, dataFile), last*4096+10))
	rep = runCheck(t, dir)
	d0 := damages(rep)
	require.Len(t, d0, 1, "%v", rep.Findings)
	requireFinding(t, d0[0], Finding{Damage: true, File: entryFile(t, dir, 0), Offset: entryOff(t, dir, 0, lastPage), Table: 1,
		Page: int64(lastPage), DiskPage: last}, fmt.Sprintf("maps disk page %d", last), "beyond its end", fmt.Sprintf("holds %d bytes", last*4096+10))
	require.Len(t, rep.Findings, 2, "and a note on the partial page")
	requireFinding(t, rep.Findings[1], Finding{File: dataFile, Offset: last * 4096, Table: 1, Page: -1, DiskPage: last}, "10 bytes after the last whole disk page")

	// The data file missing.
	dir = copyStore(t, s.clean)
	require.NoError(t, os.Remove(filepath.Join(dir, dataFile)))
	rep = runCheck(t, dir)
	require.Len(t, damages(rep), items.pages.count(), "every mapped page of items")
	require.Contains(t, damages(rep)[0].What, dataFile+" is missing")

	// An absent slot holding bytes, under a matching checksum.
	dir = copyStore(t, s.clean)
	p2 := items.pages.get(2)
	require.Equal(t, ^uint64(0xff00), p2.present)
	b, err = os.ReadFile(filepath.Join(dir, dataFile))
	require.NoError(t, err)
	pb := b[int64(p2.disk-1)*4096:][:4096]
	pb[9*64+3] = 1
	writeTestFile(t, filepath.Join(dir, dataFile), b)
	editMeta(t, dir, func(m *metaState) { editEntry(&m.tables[0].pages, 2, func(e *mapEntry) { e.crc = checksum.Of(pb) }) })
	rep = runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: dataFile, Offset: int64(p2.disk-1)*4096 + 9*64, Table: 1, Page: 2,
		DiskPage: int64(p2.disk - 1)}, "slot 9 is absent", "not zero")

	// Padding after the rows of a wide page (136-byte rows, 12 KiB disk pages).
	dir = copyStore(t, s.clean)
	w0 := m.tables[1].pages.get(0)
	wideFile := "table-00000002.dat"
	b, err = os.ReadFile(filepath.Join(dir, wideFile))
	require.NoError(t, err)
	pb = b[int64(w0.disk-1)*12288:][:12288]
	pb[12000] = 1
	writeTestFile(t, filepath.Join(dir, wideFile), b)
	editMeta(t, dir, func(m *metaState) { editEntry(&m.tables[1].pages, 0, func(e *mapEntry) { e.crc = checksum.Of(pb) }) })
	rep = runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: wideFile, Offset: int64(w0.disk-1)*12288 + 64*136, Table: 2, Page: 0,
		DiskPage: int64(w0.disk - 1)}, "padding")
}

func TestCheckPageMapDamage(t *testing.T) {
	s := buildCheckStores(t)
	m := loadTestMeta(t, s.clean)
	items := &m.tables[0]

	// A page mapped twice: pages 1 and 3 both say disk page D.
	dir := copyStore(t, s.clean)
	d := int64(items.pages.get(1).disk - 1)
	editMeta(t, dir, func(m *metaState) {
		editEntry(&m.tables[0].pages, 3, func(e *mapEntry) { e.disk = m.tables[0].pages.get(1).disk })
	})
	rep := runCheck(t, dir)
	var dup []Finding
	for _, f := range damages(rep) {
		if strings.Contains(f.What, "mapped by") {
			dup = append(dup, f)
		}
	}
	require.Len(t, dup, 1, "%v", rep.Findings)
	requireFinding(t, dup[0], Finding{Damage: true, File: entryFile(t, dir, 0), Offset: entryOff(t, dir, 0, 3), Table: 1, Page: 3, DiskPage: d},
		fmt.Sprintf("disk page %d is mapped by logical pages 1, 3", d))
	require.Len(t, damages(rep), 2, "and page 3's checksum does not match page 1's bytes: %v", rep.Findings)
	require.Equal(t, uint64(1)+runCheck(t, s.clean).FreeDiskPages, rep.FreeDiskPages, "page 3's own disk page is free now")

	// A page in use whose disk page is free: rows, but no disk page.
	dir = copyStore(t, s.clean)
	editMeta(t, dir, func(m *metaState) { editEntry(&m.tables[0].pages, 5, func(e *mapEntry) { e.disk = 0 }) })
	rep = runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: entryFile(t, dir, 0), Offset: entryOff(t, dir, 0, 5), Table: 1, Page: 5, DiskPage: -1},
		"has rows (present mask 0xffffffffffffffff) but no disk page")

	// Rows at or above the granted ids.
	dir = copyStore(t, s.clean)
	editMeta(t, dir, func(m *metaState) { m.tables[0].nextID = 7 * 64 })
	rep = runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: entryFile(t, dir, 0), Offset: entryOff(t, dir, 0, 7), Table: 1, Page: 7,
		DiskPage: int64(items.pages.get(7).disk - 1)}, "holds row 503", "next id 448")

	// A page LSN after the WAL's end: records the checkpoint had synced are missing.
	dir = copyStore(t, s.clean)
	editMeta(t, dir, func(m *metaState) { editEntry(&m.tables[1].pages, 2, func(e *mapEntry) { e.lsn = s.lastLSN + 5 }) })
	rep = runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: entryFile(t, dir, 1), Offset: entryOff(t, dir, 1, 2), Table: 2, Page: 2,
		DiskPage: int64(m.tables[1].pages.get(2).disk - 1)}, fmt.Sprintf("page LSN %d is after the WAL's last good record %d", s.lastLSN+5, s.lastLSN))
}

func TestCheckWALDamage(t *testing.T) {
	s := buildCheckStores(t)
	file, offs := walRecordOffsets(t, s.crash)
	require.Len(t, offs, int(s.lastLSN))

	// A record at or below the checkpoint's synced LSN.
	dir := copyStore(t, s.crash)
	flipByte(t, filepath.Join(dir, file), offs[3]+40)
	rep := runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: file, Offset: offs[3], Page: -1, DiskPage: -1, LSN: 3},
		"at or below the checkpoint LSN")

	// A record after it, which a later record proves had been synced.
	dir = copyStore(t, s.crash)
	flipByte(t, filepath.Join(dir, file), offs[s.ckptLSN+1]+40)
	rep = runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: file, Offset: offs[s.ckptLSN+1], Page: -1, DiskPage: -1, LSN: s.ckptLSN + 1},
		"so the bad one had been durable")

	// The last record: a torn tail, reported as a note, not damage.
	dir = copyStore(t, s.crash)
	flipByte(t, filepath.Join(dir, file), offs[s.lastLSN]+40)
	rep = runCheck(t, dir)
	require.False(t, rep.Damaged(), "%v", rep.Findings)
	require.Len(t, rep.Findings, 1)
	info, err := os.Stat(filepath.Join(dir, file))
	require.NoError(t, err)
	requireFinding(t, rep.Findings[0], Finding{File: file, Offset: offs[s.lastLSN], Page: -1, DiskPage: -1, LSN: s.lastLSN},
		"torn tail", fmt.Sprintf("drops these %d bytes", info.Size()-offs[s.lastLSN]))
	require.Equal(t, s.lastLSN-1, rep.LastLSN)

	// Truncated inside a record at or below the checkpoint.
	dir = copyStore(t, s.crash)
	require.NoError(t, os.Truncate(filepath.Join(dir, file), offs[s.ckptLSN]+20))
	rep = runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: file, Offset: offs[s.ckptLSN], Page: -1, DiskPage: -1, LSN: s.ckptLSN},
		"at or below the checkpoint LSN")

	// Truncated in the clean store, whose synced LSN is its last record: the log must reach it.
	cfile, coffs := walRecordOffsets(t, s.clean)
	dir = copyStore(t, s.clean)
	require.NoError(t, os.Truncate(filepath.Join(dir, cfile), coffs[s.lastLSN]))
	rep = runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: cfile, Offset: coffs[s.lastLSN], Page: -1, DiskPage: -1, LSN: s.lastLSN},
		"before the checkpoint LSN")

	// A WAL segment missing.
	dir = copyStore(t, s.crash)
	require.NoError(t, os.Remove(filepath.Join(dir, file)))
	rep = runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: "wal", Offset: -1, Page: -1, DiskPage: -1}, "no segment files")
	require.NoError(t, os.RemoveAll(filepath.Join(dir, "wal")))
	rep = runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: "wal", Offset: -1, Page: -1, DiskPage: -1},
		fmt.Sprintf("the WAL directory is missing, but records through LSN %d were durable", s.ckptLSN))
}

func TestCheckCatalogDamage(t *testing.T) {
	s := buildCheckStores(t)
	file, offs := walRecordOffsets(t, s.crash)

	// The meta file says items has 128-byte rows: its pages and its WAL commits disagree.
	dir := copyStore(t, s.crash)
	editMeta(t, dir, func(m *metaState) { m.tables[0].rowBytes = 128 })
	rep := runCheck(t, dir)
	var segs int
	for _, f := range damages(rep) {
		if strings.Contains(f.What, "does not fit the table (row size 128") {
			segs++
			require.Equal(t, file, f.File)
			require.Equal(t, offs[f.LSN], f.Offset)
			require.EqualValues(t, 1, f.Table)
		}
	}
	require.Equal(t, 7, segs, "the seven commits to items after the checkpoint: %v", rep.Findings)

	// A WAL commit to rows never granted. The engine refuses such a commit, so the record is
	// appended to the stopped store's log directly, as a buggy or older engine would have.
	dir = copyStore(t, s.clean)
	image, lsn := appendUngrantedCommit(t, dir, base.Segment{Table: 1, Page: 100, Data: 1, Rows: make([]byte, 64)})
	requireUngrantedCommitRefused(t, dir, image, file, lsn)
}

// appendUngrantedCommit appends to the stopped store in dir, straight to its WAL, a commit of
// seg (to table 1 under its grant, for row 6400, never granted: the engine refuses such a
// commit, a buggy or older engine would have written it), and copies the store to an image.
func appendUngrantedCommit(t *testing.T, dir string, seg base.Segment) (image string, lsn uint64) {
	t.Helper()
	e := openEngine(t, checkTestOptions(dir))
	g := acquire(t, e, 1, checkOwner, 0)
	require.NoError(t, e.Close())
	b := &base.Batch{Owner: checkOwner, Seq: g.LastSeq + 1, Fences: []base.Fence{{Table: 1, Epoch: g.Epoch}},
		Segments: []base.Segment{seg}}
	log, err := wal.Open(vfs.Default, walDir(dir), wal.Options{}, nil)
	require.NoError(t, err)
	lsn, err = log.Append(context.Background(), kindCommit,
		[][]byte{appendCommitRecord(nil, b, batchHash(b), func(uint32) int { return 64 })}, false)
	require.NoError(t, err)
	require.NoError(t, log.Close())
	image = filepath.Join(t.TempDir(), "image")
	require.NoError(t, os.CopyFS(image, os.DirFS(dir)))
	return image, lsn
}

// requireUngrantedCommitRefused: Check of image reports the commit at lsn (appendUngrantedCommit)
// as the only damage, in WAL file file, and replay of dir refuses it, as Check does.
func requireUngrantedCommitRefused(t *testing.T, dir, image, file string, lsn uint64) {
	t.Helper()
	_, offs := walRecordOffsets(t, image)
	rep := runCheck(t, image)
	requireOnly(t, rep, Finding{Damage: true, File: file, Offset: offs[lsn], Table: 1, Page: -1, DiskPage: -1, LSN: lsn},
		"names row 6400", "at or above the table's granted ids (next id 512)")
	_, err := Open(checkTestOptions(dir)) // replay refuses it, as Check does
	require.ErrorIs(t, err, corrupt.ErrCorruption)
	require.ErrorContains(t, err, "row 6400 of table 1 was never granted")
}

func TestCheckNotes(t *testing.T) {
	s := buildCheckStores(t)
	dir := copyStore(t, s.clean)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "table-00000099.dat"), []byte("x"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, metaTempName), []byte("half"), 0o644))
	require.NoError(t, os.Remove(filepath.Join(dir, "LOCK"))) // a copy without it checks too
	rep := runCheck(t, dir)
	require.False(t, rep.Damaged())
	require.Len(t, rep.Findings, 2, "%v", rep.Findings)
	require.Equal(t, metaTempName, rep.Findings[0].File)
	require.Equal(t, "table-00000099.dat", rep.Findings[1].File)
	require.Contains(t, rep.Findings[1].String(), "note: table-00000099.dat: data file of no table")

	// Findings beyond the bound are counted, not kept.
	dir = copyStore(t, s.clean)
	editMeta(t, dir, func(m *metaState) {
		for i := range m.tables[0].pages.all() {
			editEntry(&m.tables[0].pages, i, func(e *mapEntry) { e.crc ^= 1 })
		}
	})
	rep = requireChecked(t, context.Background(), dir, CheckOptions{MaxFindings: 3})
	require.Len(t, rep.Findings, 3)
	require.Equal(t, loadTestMeta(t, dir).tables[0].pages.count()-3, rep.Omitted)
	require.Equal(t, loadTestMeta(t, dir).tables[0].pages.count(), rep.DamageCount())
}

// requireCheckNoDamage checks the store in dir of fsys (a state recovery must accept, such as
// one a power loss left) and requires no damage.
func requireCheckNoDamage(t *testing.T, fsys vfs.FS, dir string, msg string) {
	t.Helper()
	rep, err := Check(context.Background(), dir, CheckOptions{FS: fsys})
	if errors.Is(err, ErrNotStore) {
		return // the crash came before the store was made
	}
	require.NoError(t, err, msg)
	require.Empty(t, damages(rep), msg)
}

// TestCheckCatalogChangesAfterCheckpoint: tables created and dropped after the checkpoint,
// in the WAL only, check clean (no false damage), before and after recovery.
func TestCheckCatalogChangesAfterCheckpoint(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	e := openEngine(t, checkTestOptions(dir))
	require.NoError(t, e.Close())
	rep := runCheck(t, dir) // an empty store
	require.False(t, rep.Damaged(), "%v", rep.Findings)
	require.Empty(t, rep.Findings)

	e = openEngine(t, checkTestOptions(dir))
	a, err := e.CreateTable("a", 8)
	require.NoError(t, err)
	require.NoError(t, e.Checkpoint())
	b, g := ownedTable(t, e, "b", 32, checkOwner, 2)
	commitWait(t, e, &base.Batch{Owner: checkOwner, Seq: 1, Fences: []base.Fence{{Table: b.ID, Epoch: g.Epoch}},
		Segments: []base.Segment{{Table: b.ID, Page: 1, Data: 3, Rows: make([]byte, 64)}}})
	require.NoError(t, e.DropTable(a.Name, 0))
	image := filepath.Join(t.TempDir(), "image")
	require.NoError(t, os.CopyFS(image, os.DirFS(dir)))
	require.NoError(t, e.Close())
	for _, d := range []string{image, dir} {
		rep = runCheck(t, d)
		require.False(t, rep.Damaged(), "%v", rep.Findings)
		require.Empty(t, rep.Findings)
	}
	require.Equal(t, 2, runCheck(t, image).Tables, "a (dropped in the WAL) and b")
	require.Equal(t, 1, runCheck(t, dir).Tables)
	require.NoFileExists(t, filepath.Join(dir, "table-00000001.dat"))
}

// TestCheckGrantAfterCheckpointStart: a checkpoint takes the meta file's next id when it
// starts, and a page it copies later may hold rows of a grant logged after that; the WAL's
// grant covers them, so it is no damage. (The meta file here says next id 256 while pages 4
// and 5 hold rows up to 383, and the WAL after the checkpoint grants up to 1024.)
func TestCheckGrantAfterCheckpointStart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	e := openEngine(t, checkTestOptions(dir))
	ti, g := ownedTable(t, e, "t", 64, checkOwner, 6)
	for p := uint64(0); p < 6; p++ {
		commitWait(t, e, &base.Batch{Owner: checkOwner, Seq: p + 1, Fences: []base.Fence{{Table: ti.ID, Epoch: g.Epoch}},
			Segments: []base.Segment{{Table: ti.ID, Page: p, Data: ^uint64(0), Rows: checkRows(64, 64, p, 1)}}})
	}
	require.NoError(t, e.Checkpoint())
	_, _, err := e.AllocIDs(ti.ID, checkOwner, g.Epoch, 10)
	require.NoError(t, err)
	image := filepath.Join(t.TempDir(), "image")
	require.NoError(t, os.CopyFS(image, os.DirFS(dir)))
	require.NoError(t, e.Close())
	editMeta(t, image, func(m *metaState) { m.tables[0].nextID = 4 * 64 })
	rep := runCheck(t, image)
	require.False(t, rep.Damaged(), "%v", rep.Findings)
}

// TestCheckEpochGrantedTwice: the meta file says a table's epoch is above the one a later
// ownership record grants.
func TestCheckEpochGrantedTwice(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	e := openEngine(t, checkTestOptions(dir))
	ti, err := e.CreateTable("t", 64)
	require.NoError(t, err)
	require.NoError(t, e.Checkpoint())
	g := acquire(t, e, ti.ID, checkOwner, 0)
	image := filepath.Join(t.TempDir(), "image")
	require.NoError(t, os.CopyFS(image, os.DirFS(dir)))
	require.NoError(t, e.Close())
	rep := runCheck(t, image)
	require.False(t, rep.Damaged(), "%v", rep.Findings)
	editMeta(t, image, func(m *metaState) { m.tables[0].epoch = g.Epoch })
	file, offs := walRecordOffsets(t, image)
	rep = runCheck(t, image)
	requireOnly(t, rep, Finding{Damage: true, File: file, Offset: offs[rep.LastLSN], Table: ti.ID, Page: -1, DiskPage: -1, LSN: rep.LastLSN},
		fmt.Sprintf("ownership grant of epoch %d, not above the table's epoch %d", g.Epoch, g.Epoch))
}
