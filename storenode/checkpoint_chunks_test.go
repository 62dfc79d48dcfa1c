package storenode

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/testseed"
	"github.com/weftdb/weft/internal/vfs"
)

// A table dropped while a checkpoint copies its pages: the checkpoint skips the dropped
// table's dirty pages, so the meta file it publishes holds the table (it was live at the
// snapshot) with a page map missing commits at or below the checkpoint LSN, which recovery no
// longer replays. That is only right once the drop record, which recovery replays after the
// checkpoint LSN, is durable. Here the drop record's WAL write fails (so it never reaches the
// disk) while the checkpoint goes on, and the power is lost after: DropTable never succeeded,
// so the table must come back whole, with every acknowledged row.
// reviewChunks are lock holds small enough that the crash harnesses' checkpoints cross
// chunk boundaries.
var reviewChunks = ckptChunks{scanFrames: 2, copyBytes: 4096, installWrites: 1}

var errDropWriteLost = errors.New("test: the drop record's write is lost")

func TestCheckpointTableDroppedMidCheckpointKeepsRows(t *testing.T) {
	fs := vfs.NewFaultFS()
	opts := Options{Dir: "db", FS: fs, Logger: quietLogger, Sync: SyncAlways, CheckpointInterval: -1, CheckpointWALBytes: -1}
	e := openEngine(t, opts)
	info, g := ownedTable(t, e, "t", 64, testOwner, 1)
	commit := func(e *Engine, seq, id uint64) {
		ch := make(chan error, 1)
		e.Commit(batchOf(testOwner, seq, info.ID, g.Epoch, oneRow(info.ID, id, row64(100+id))), func(_ uint64, err error) { ch <- err })
		require.NoError(t, <-ch)
	}
	commit(e, 1, 0)
	require.NoError(t, e.Checkpoint()) // page 0 gets a disk copy
	require.NoError(t, e.Close())

	e = openEngine(t, opts)
	commit(e, 2, 1) // a partial frame: the checkpoint reads the disk copy, releasing mu

	dataFile := strings.TrimPrefix(dataFileName("db", info.ID), "/")
	var (
		mu         sync.Mutex
		holdRead   = true
		holdWAL    = false
		readHeld   = make(chan struct{})
		readGo     = make(chan struct{})
		walHeld    = make(chan struct{})
		walGo      = make(chan struct{})
		readSignal sync.Once
		walSignal  sync.Once
	)
	fs.Inject(func(op vfs.Op) error {
		mu.Lock()
		hr, hw := holdRead, holdWAL
		mu.Unlock()
		switch {
		case hr && op.Kind == vfs.OpRead && op.Name == dataFile:
			readSignal.Do(func() { close(readHeld) })
			<-readGo
		case hw && op.Kind == vfs.OpWrite && strings.HasPrefix(op.Name, "db/wal/"):
			walSignal.Do(func() { close(walHeld) })
			<-walGo
			return errDropWriteLost
		}
		return nil
	})
	ckptErr := make(chan error, 1)
	go func() { ckptErr <- e.Checkpoint() }()
	<-readHeld // the checkpoint took its snapshot and is merging the partial frame, mu released
	mu.Lock()
	holdRead, holdWAL = false, true
	mu.Unlock()
	dropErr := make(chan error, 1)
	go func() { dropErr <- e.DropTable("t", testOwner) }()
	<-walHeld // the drop record is logged (and the table removed under the same hold of mu), not written
	close(readGo)
	close(walGo) // the drop record's write fails: it never reaches the disk
	require.ErrorIs(t, <-dropErr, errDropWriteLost)
	_ = <-ckptErr // fails (the WAL failed) once it waits for the drop record, as it must
	_ = e.Close()
	fs.Crash(nil)
	fs.Inject(nil)

	e = openEngine(t, opts)
	defer e.Close()
	got, err := e.OpenTable("t")
	require.NoError(t, err, "the drop never became durable: the table is still there")
	require.Equal(t, info.ID, got.ID)
	for id := uint64(0); id < 2; id++ {
		row, ok := readRow(t, e, info.ID, id)
		require.True(t, ok, "acknowledged row %d lost", id)
		require.Equal(t, row64(100+id), row)
	}
}

// Check and replay agree on a WAL commit naming a row never granted by its clear mask alone,
// or by an empty segment on a page whose first id was never granted: replay refuses both
// (segmentLastID), so Check must report them as damage, not pass the store.
func TestCheckUngrantedClearOrEmptySegmentAgreesWithOpen(t *testing.T) {
	s := buildCheckStores(t)
	for _, seg := range []base.Segment{{Table: 1, Page: 100, Clear: 1}, {Table: 1, Page: 100}} {
		dir := copyStore(t, s.clean)
		image, lsn := appendUngrantedCommit(t, dir, seg)
		file, _ := walRecordOffsets(t, image)
		requireUngrantedCommitRefused(t, dir, image, file, lsn)
	}
}

// encodeDenseMeta encodes m as the version-2 meta file the build before the sparse page map
// wrote: a u64 page count and a dense map (a zero entry for a page without one). The owners
// are laid out as in version 3.
func encodeDenseMeta(m *metaState) []byte {
	v3 := encodeSparseMeta(m)
	owners := int64(metaHeaderBytes)
	for i := range m.tables {
		owners += metaTableBytes + int64(pad8(len(m.tables[i].name))) + int64(m.tables[i].pages.leafCount())*metaLeafBytes +
			int64(m.tables[i].pages.count())*metaEntryBytes
	}
	b := append([]byte(nil), v3[:metaHeaderBytes]...)
	binary.LittleEndian.PutUint32(b[8:], metaVersionDense)
	for _, t := range m.tables {
		var n uint64
		for page := range t.pages.all() {
			n = page + 1
		}
		b = binary.LittleEndian.AppendUint32(b, t.id)
		b = binary.LittleEndian.AppendUint16(b, uint16(t.rowBytes))
		b = binary.LittleEndian.AppendUint16(b, uint16(len(t.name)))
		b = binary.LittleEndian.AppendUint64(b, t.nextID)
		b = binary.LittleEndian.AppendUint64(b, t.holder)
		b = binary.LittleEndian.AppendUint64(b, t.epoch)
		b = binary.LittleEndian.AppendUint64(b, n)
		b = append(b, t.name...)
		b = append(b, make([]byte, pad8(len(t.name))-len(t.name))...)
		for page := range n {
			e := t.pages.get(page)
			b = binary.LittleEndian.AppendUint32(b, e.disk)
			b = binary.LittleEndian.AppendUint32(b, e.crc)
			b = binary.LittleEndian.AppendUint64(b, e.lsn)
			b = binary.LittleEndian.AppendUint64(b, e.present)
		}
	}
	b = append(b, v3[owners:len(v3)-metaTrailerBytes]...)
	b = binary.LittleEndian.AppendUint32(b, checksum.Of(b))
	return binary.LittleEndian.AppendUint32(b, 0)
}

// A store whose meta file is version 2 (written by the build before the sparse page map):
// Check passes it and places a damaged page's entry at its dense offset; Open reads it with
// every row, and the next checkpoint upgrades it to version 3, which checks clean and reopens
// with every row.
func TestDenseMetaStoreChecksOpensAndUpgrades(t *testing.T) {
	fs := vfs.NewFaultFS()
	opts := Options{Dir: "db", FS: fs, Logger: quietLogger, CheckpointInterval: -1, CheckpointWALBytes: -1}
	e := openEngine(t, opts)
	info, g := ownedTable(t, e, "t", 64, testOwner, 200)
	seq := uint64(0)
	commit := func(e *Engine, id uint64) {
		seq++
		ch := make(chan error, 1)
		e.Commit(batchOf(testOwner, seq, info.ID, g.Epoch, oneRow(info.ID, id, row64(id))), func(_ uint64, err error) { ch <- err })
		require.NoError(t, <-ch)
	}
	ids := []uint64{0, 5, 64 * 3, 64*130 + 7, 64*199 + 63}
	for _, id := range ids[:4] {
		commit(e, id)
	}
	require.NoError(t, e.Checkpoint())
	require.NoError(t, e.Close())

	m, _, err := loadMeta(fs, "db")
	require.NoError(t, err)
	require.NoError(t, fs.Remove("db/"+mapLogName(m.logGen)))
	dense := encodeDenseMeta(m)
	dm, err := decodeMeta(dense)
	require.NoError(t, err)
	require.EqualValues(t, metaVersionDense, dm.version)
	require.NoError(t, fs.WriteFile("db/meta", dense))
	requireCheckNoDamage(t, fs, "db", "version-2 store")

	// A damaged disk page: Check names its entry at the dense layout's offset.
	ent := dm.tables[0].pages.get(130)
	require.NotZero(t, ent.disk)
	data, err := fs.ReadFile(dataFileName("db", info.ID))
	require.NoError(t, err)
	damaged := append([]byte(nil), data...)
	damaged[int64(ent.disk-1)*4096+100] ^= 1
	require.NoError(t, fs.WriteFile(dataFileName("db", info.ID), damaged))
	rep := requireChecked(t, context.Background(), "db", CheckOptions{FS: fs})
	d := damages(rep)
	require.Len(t, d, 1, "%v", rep.Findings)
	require.Contains(t, d[0].What, fmt.Sprintf("meta offset %d", metaHeaderBytes+metaTableBytes+8+130*metaEntryBytes))
	require.NoError(t, fs.WriteFile(dataFileName("db", info.ID), data))

	e = openEngine(t, opts)
	for _, id := range ids[:4] {
		row, ok := readRow(t, e, info.ID, id)
		require.True(t, ok, "row %d", id)
		require.Equal(t, row64(id), row)
	}
	// A backup of the version-2 store (nothing logged since: its meta file is copied as it
	// is) restores with every row.
	cfs := vfs.NewFaultFS()
	bd, err := NewBackupDir(cfs, "copy")
	require.NoError(t, err)
	binfo, err := e.Backup(context.Background(), bd)
	require.NoError(t, err)
	require.NoError(t, bd.Finish(binfo))
	cb, err := cfs.ReadFile("copy/meta")
	require.NoError(t, err)
	require.EqualValues(t, metaVersionDense, binary.LittleEndian.Uint32(cb[8:]), "the copy's meta file is version 2")
	requireCheckNoDamage(t, cfs, "copy", "backup of a version-2 store")
	c := openEngine(t, Options{Dir: "copy", FS: cfs, Logger: quietLogger, CheckpointInterval: -1})
	for _, id := range ids[:4] {
		row, ok := readRow(t, c, info.ID, id)
		require.True(t, ok, "row %d in the copy", id)
		require.Equal(t, row64(id), row)
	}
	require.NoError(t, c.Close())
	g = acquire(t, e, info.ID, testOwner, 0)
	seq = g.LastSeq
	commit(e, ids[4])
	require.NoError(t, e.Checkpoint())
	require.NoError(t, e.Close())
	m, _, err = loadMeta(fs, "db")
	require.NoError(t, err)
	require.EqualValues(t, metaVersion, m.version, "the checkpoint upgraded the meta file")
	require.NotZero(t, m.logGen, "the upgrade wrote a map log")
	requireCheckNoDamage(t, fs, "db", "upgraded store")
	fs.Crash(nil)
	e = openEngine(t, opts)
	defer e.Close()
	for _, id := range ids {
		row, ok := readRow(t, e, info.ID, id)
		require.True(t, ok, "row %d", id)
		require.Equal(t, row64(id), row)
	}
}

type discardSink struct{}

func (discardSink) WriteChunk(context.Context, BackupFile, int64, []byte) error { return nil }

// Checkpoints with tiny lock holds, back to back, while one goroutine commits to a table,
// another creates a table, commits to it and drops it (over and over), and a third takes
// backups: after a power loss every acknowledged row of the kept tables is there, no dropped
// table comes back, and the engine's invariants held after every checkpoint. Run with -race
// -short.
func TestCheckpointChunksBesideCatalogChangesAndBackups(t *testing.T) {
	for _, mode := range []SyncMode{SyncAlways, SyncNone} {
		t.Run(fmt.Sprintf("sync=%s", mode), func(t *testing.T) { testCheckpointChunksBesideCatalogChanges(t, mode) })
	}
}

// commitNextSeq commits row id of table at version v as testOwner's next seq (*seq, guarded
// by mu, which is held until the batch is queued so that seqs queue in order) and waits for
// its outcome.
func commitNextSeq(e *Engine, mu *sync.Mutex, seq *uint64, table uint32, epoch, id, v uint64) error {
	ch := make(chan error, 1)
	mu.Lock()
	*seq++
	e.Commit(batchOf(testOwner, *seq, table, epoch, oneRow(table, id, row64(v))), func(_ uint64, err error) { ch <- err })
	mu.Unlock()
	return <-ch
}

// repeatUntil runs step again and again until done is closed or step fails; a failure is
// sent on errs.
func repeatUntil(done <-chan struct{}, errs chan<- error, step func() error) {
	for {
		select {
		case <-done:
			return
		default:
		}
		if err := step(); err != nil {
			errs <- err
			return
		}
	}
}

func testCheckpointChunksBesideCatalogChanges(t *testing.T, mode SyncMode) {
	fs := vfs.NewFaultFS()
	opts := Options{Dir: "db", FS: fs, Logger: quietLogger, Sync: mode, CheckpointInterval: -1, CheckpointWALBytes: -1,
		CacheBytes: 64 * (4096 + frameOverheadBytes)}
	e := openEngine(t, opts)
	e.ckptChunk = ckptChunks{scanFrames: 3, copyBytes: 2 * 4096, installWrites: 1}
	const pages = 40
	info, g := ownedTable(t, e, "a", 64, testOwner, pages)
	cycles := testseed.Scaled(8, 30, 200)
	commitsA := testseed.Scaled(150, 600, 5000)

	var (
		seqMu sync.Mutex
		seq   uint64
	)
	commit := func(table uint32, epoch, id, v uint64) error {
		return commitNextSeq(e, &seqMu, &seq, table, epoch, id, v)
	}
	latest := make(map[uint64]uint64)
	errs := make(chan error, 4)
	done := make(chan struct{})
	var wg, bg sync.WaitGroup
	wg.Add(2)
	go func() { // commits to a
		defer wg.Done()
		for i := range commitsA {
			id := uint64(i*977) % (pages * 64)
			if err := commit(info.ID, g.Epoch, id, uint64(i+1)<<20|id); err != nil {
				errs <- fmt.Errorf("commit to a: %w", err)
				return
			}
			latest[id] = uint64(i+1)<<20 | id
		}
	}()
	var kept base.TableInfo
	go func() { // create, commit, drop
		defer wg.Done()
		for c := range cycles {
			ti, err := e.CreateTable(fmt.Sprintf("b%d", c), 64)
			if err == nil {
				var gb base.Grant
				if gb, err = e.Acquire(ti.ID, testOwner, 0); err == nil {
					if _, err = grantPages(e, ti.ID, testOwner, gb.Epoch, 4); err == nil {
						for id := uint64(0); id < 4*64 && err == nil; id += 17 {
							err = commit(ti.ID, gb.Epoch, id, id+1)
						}
					}
				}
			}
			if err == nil && c < cycles-1 {
				err = e.DropTable(ti.Name, testOwner)
			}
			if err != nil {
				errs <- fmt.Errorf("cycle %d: %w", c, err)
				return
			}
			kept = ti
		}
	}()
	bg.Add(2)
	go func() { // checkpoints
		defer bg.Done()
		repeatUntil(done, errs, func() error {
			if err := e.Checkpoint(); err != nil {
				return err
			}
			if err := e.verify(); err != nil {
				return fmt.Errorf("after a checkpoint: %w", err)
			}
			return nil
		})
	}()
	go func() { // backups
		defer bg.Done()
		repeatUntil(done, errs, func() error {
			if _, err := e.Backup(context.Background(), discardSink{}); err != nil && !errors.Is(err, ErrBackupBusy) {
				return fmt.Errorf("backup: %w", err)
			}
			return nil
		})
	}()
	wg.Wait()
	close(done)
	bg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, e.Checkpoint())
	require.NoError(t, e.verify())
	require.NoError(t, e.Close())
	fs.Crash(nil)

	e = openEngine(t, opts)
	defer e.Close()
	require.NoError(t, e.verify())
	names := map[string]bool{}
	for _, ti := range e.Tables() {
		names[ti.Name] = true
	}
	require.Equal(t, map[string]bool{"a": true, kept.Name: true}, names)
	for id, v := range latest {
		row, ok := readRow(t, e, info.ID, id)
		require.True(t, ok, "row %d of a", id)
		require.Equal(t, row64(v), row, "row %d of a", id)
	}
	for id := uint64(0); id < 4*64; id += 17 {
		row, ok := readRow(t, e, kept.ID, id)
		require.True(t, ok, "row %d of %s", id, kept.Name)
		require.Equal(t, row64(id+1), row)
	}
}

// Power loss in the middle of chunked checkpoints beside commits, table creations and drops:
// every acknowledged row survives, a table whose drop was acknowledged stays dropped, and a
// table whose drop was still in flight is either gone or whole (never missing a row).
func TestCheckpointChunksPowerLossBesideDrops(t *testing.T) {
	for run := range testseed.Scaled(6, 20, 200) {
		testCheckpointChunksPowerLoss(t, run)
		if t.Failed() {
			return
		}
	}
}

func testCheckpointChunksPowerLoss(t *testing.T, run int) {
	fs := vfs.NewFaultFS()
	opts := Options{Dir: "db", FS: fs, Logger: quietLogger, CheckpointInterval: -1, CheckpointWALBytes: -1,
		CacheBytes: 64 * (4096 + frameOverheadBytes)}
	e := openEngine(t, opts)
	e.ckptChunk = ckptChunks{scanFrames: 1 + run%3, copyBytes: 4096, installWrites: 1}
	const pages = 20
	info, g := ownedTable(t, e, "a", 64, testOwner, pages)
	crashAt := 40 + run*13%200

	var (
		mu      sync.Mutex
		seq     uint64
		crashed bool
		latest  = map[uint64]uint64{} // row of a -> last acknowledged version
		issued  = map[uint64]uint64{} // row of a -> last version sent
		tables  = map[string][]uint64{}
		dropped = map[string]bool{} // drop acknowledged
		pending = map[string]bool{} // drop in flight at the crash
	)
	commit := func(table uint32, epoch, id, v uint64) error {
		return commitNextSeq(e, &mu, &seq, table, epoch, id, v)
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		for i := 1; ; i++ {
			if i == crashAt {
				mu.Lock()
				crashed = true
				fs.Crash(nil)
				mu.Unlock()
			}
			id := uint64(i*977) % (pages * 64)
			v := uint64(i)<<20 | id
			mu.Lock()
			issued[id] = v
			mu.Unlock()
			if commit(info.ID, g.Epoch, id, v) != nil {
				return
			}
			mu.Lock()
			latest[id] = v
			mu.Unlock()
		}
	}()
	go func() {
		defer wg.Done()
		for c := 0; ; c++ {
			name := fmt.Sprintf("b%d", c)
			ti, err := e.CreateTable(name, 64)
			if err != nil {
				return
			}
			mu.Lock()
			tables[name] = nil
			mu.Unlock()
			gb, err := e.Acquire(ti.ID, testOwner, 0)
			if err != nil {
				return
			}
			if _, err = grantPages(e, ti.ID, testOwner, gb.Epoch, 2); err != nil {
				return
			}
			for id := uint64(0); id < 2*64; id += 9 {
				if commit(ti.ID, gb.Epoch, id, id+1) != nil {
					return
				}
				mu.Lock()
				tables[name] = append(tables[name], id)
				mu.Unlock()
			}
			mu.Lock()
			pending[name] = true
			mu.Unlock()
			err = e.DropTable(name, testOwner)
			mu.Lock()
			if err == nil {
				dropped[name] = true
				delete(pending, name)
			}
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for e.Checkpoint() == nil {
		}
	}()
	wg.Wait()
	require.True(t, crashed)
	_ = e.Close()
	fs.Crash(nil)

	e, err := Open(opts)
	require.NoError(t, err, "run %d", run)
	defer e.Close()
	present := map[string]base.TableInfo{}
	for _, ti := range e.Tables() {
		present[ti.Name] = ti
	}
	for id, v := range latest {
		row, ok := readRow(t, e, info.ID, id)
		require.True(t, ok, "run %d: row %d of a", run, id)
		got := binary.LittleEndian.Uint64(row)
		require.True(t, got == v || got == issued[id], "run %d: row %d of a: version %x, acknowledged %x", run, id, got, v)
	}
	for name, ids := range tables {
		ti, ok := present[name]
		if dropped[name] {
			require.False(t, ok, "run %d: %s was dropped", run, name)
			continue
		}
		if !ok {
			require.True(t, pending[name], "run %d: %s lost", run, name)
			continue
		}
		for _, id := range ids {
			row, ok := readRow(t, e, ti.ID, id)
			require.True(t, ok, "run %d: row %d of %s (drop in flight: %v)", run, id, name, pending[name])
			require.Equal(t, row64(id+1), row)
		}
	}
}
