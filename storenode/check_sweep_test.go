package storenode

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/vfs"
)

// The byte-flip sweep: every byte of a small store's meta file, data file and WAL segment is
// changed in turn (and every file cut short at every length), and Check's verdict is held against what Open and a reader of every row
// then get. A change Open refuses, or one that changes what a reader gets, must be reported
// as damage; one Check passes must open and read exactly as the undamaged store (or, when
// Check notes a torn tail, open and read without error: recovery drops the tail).

// sweepFiles is a store's files by name ("db/meta", "db/wal/wal-...log").
type sweepFiles map[string][]byte

func (s sweepFiles) clone() sweepFiles {
	out := make(sweepFiles, len(s))
	for k, v := range s {
		out[k] = bytes.Clone(v)
	}
	return out
}

func (s sweepFiles) fs(t testing.TB) *vfs.FaultFS {
	ffs := vfs.NewFaultFS()
	require.NoError(t, ffs.MkdirAll("db/wal"))
	for name, b := range s {
		require.NoError(t, ffs.WriteFile(name, b))
	}
	return ffs
}

// readSweepFiles returns every file of the store in ffs.
func readSweepFiles(t testing.TB, ffs *vfs.FaultFS) sweepFiles {
	out := sweepFiles{}
	for _, dir := range []string{"db", "db/wal"} {
		names, err := ffs.List(dir)
		require.NoError(t, err)
		for _, n := range names {
			if dir == "db" && n == "wal" {
				continue
			}
			b, err := ffs.ReadFile(dir + "/" + n)
			require.NoError(t, err)
			out[dir+"/"+n] = b
		}
	}
	return out
}

// buildSweepStore builds a small store: two tables, id and ownership grants, commits, a
// checkpoint, a table dropped and one created after it, more commits. It returns its files
// after Close (clean) and as they were while it ran (crash: what kill -9 leaves).
func buildSweepStore(t testing.TB) (clean, crash sweepFiles) {
	ffs := vfs.NewFaultFS()
	e := openEngine(t, Options{Dir: "db", FS: ffs, CheckpointWALBytes: -1, CheckpointInterval: -1, Logger: quietLogger})
	ti, err := e.CreateTable("t", 16)
	require.NoError(t, err)
	gone, err := e.CreateTable("gone", 8)
	require.NoError(t, err)
	g := acquire(t, e, ti.ID, 3, 0)
	_, _, err = e.AllocIDs(ti.ID, 3, g.Epoch, 4)
	require.NoError(t, err)
	seq := uint64(0)
	commit := func(table uint32, epoch uint64, rowBytes int, page, data, clear uint64) {
		seq++
		commitWait(t, e, &base.Batch{Owner: 3, Seq: seq, Fences: []base.Fence{{Table: table, Epoch: epoch}},
			Segments: []base.Segment{{Table: table, Page: page, Data: data, Clear: clear,
				Rows: checkRows(popcount(data), rowBytes, page, seq)}}})
	}
	for i := uint64(1); i <= 3; i++ {
		commit(ti.ID, g.Epoch, 16, i%3, 0x5<<i, 0x10000)
	}
	require.NoError(t, e.Checkpoint())
	require.NoError(t, e.DropTable(gone.Name, 3))
	again, g2 := ownedTable(t, e, "gone", 8, 3, 1)
	commit(again.ID, g2.Epoch, 8, 0, 0x3, 0)
	for i := uint64(4); i <= 6; i++ {
		commit(ti.ID, g.Epoch, 16, i%3, 0x5<<i, 0x10000)
	}
	crash = readSweepFiles(t, ffs)
	require.NoError(t, e.Close())
	return readSweepFiles(t, ffs), crash
}

// sweepOutcome is what Check and Open make of a store.
type sweepOutcome struct {
	rep     *CheckReport
	openErr error
	state   string // the catalog and every row a reader gets, or the read error
	readErr bool
}

func (o sweepOutcome) torn() bool {
	for _, f := range o.rep.Findings {
		if strings.Contains(f.What, "torn tail") {
			return true
		}
	}
	return false
}

// judgeStore checks the store of files, then opens a copy and reads every row.
func judgeStore(t testing.TB, files sweepFiles) sweepOutcome {
	var o sweepOutcome
	rep, err := Check(context.Background(), "db", CheckOptions{FS: files.fs(t)})
	if errors.Is(err, ErrOldFormat) { // a version field made older: not damage, and Open agrees
		_, err := Open(Options{Dir: "db", FS: files.fs(t), Logger: quietLogger})
		require.ErrorIs(t, err, ErrOldFormat)
		return sweepOutcome{rep: &CheckReport{damage: 1}}
	}
	require.NoError(t, err)
	o.rep = rep
	e, err := Open(Options{Dir: "db", FS: files.fs(t), CheckpointWALBytes: -1, CheckpointInterval: -1, Logger: quietLogger,
		ExpireLeasesAtOpen: true})
	if err != nil {
		o.openErr = err
		return o
	}
	defer e.Close()
	var b strings.Builder
	for _, ti := range e.Tables() {
		fmt.Fprintf(&b, "table %+v\n", ti)
		pages, _, err := e.PageDir(ti.ID, 0, tablePagesMax, 0, nil)
		if err != nil {
			fmt.Fprintf(&b, "pagedir error %v\n", err)
			o.readErr = true
			continue
		}
		for _, p := range pages {
			data, clear, rows, err := e.ReadRows(ti.ID, p.Page, ^uint64(0), nil)
			if err != nil {
				fmt.Fprintf(&b, "read error page %d: %v\n", p.Page, err)
				o.readErr = true
				continue
			}
			fmt.Fprintf(&b, "page %d %#x %#x %x\n", p.Page, data, clear, rows)
		}
	}
	o.state = b.String()
	return o
}

// sweepVerdict returns what is wrong with o, "" when nothing: strict holds a change Check
// passes to the undamaged store's contents (want).
func sweepVerdict(o sweepOutcome, want string, strict bool) string {
	damaged := o.rep.Damaged()
	switch {
	case o.openErr != nil && !damaged:
		return fmt.Sprintf("Open refuses (%v) but Check finds no damage: %v", o.openErr, o.rep.Findings)
	case damaged:
		return ""
	case o.readErr:
		return fmt.Sprintf("a reader gets an error but Check finds no damage:\n%s", o.state)
	case strict && !o.torn() && o.state != want:
		return fmt.Sprintf("a reader gets other rows but Check finds no damage: %v\ngot:\n%s\nwant:\n%s", o.rep.Findings, o.state, want)
	}
	return ""
}

// resealMeta makes the meta file's checksum match its bytes (a writer's bug, not bit rot).
func resealMeta(b []byte) {
	if len(b) < metaHeaderBytes+metaTrailerBytes {
		return
	}
	body := len(b) - metaTrailerBytes
	binary.LittleEndian.PutUint32(b[body:], checksum.Of(b[:body]))
}

// resealWALRecord recomputes the checksum of the record of segment b that holds offset off,
// if any (a writer's bug: the record says what it was given).
func resealWALRecord(b []byte, off int) {
	const hdr = 32
	for at := hdr; at+hdr <= len(b); {
		n := int(binary.LittleEndian.Uint32(b[at:]))
		size := hdr + (n+7)&^7
		if n == 0 && bytes.Equal(b[at:at+hdr], make([]byte, hdr)) || at+size > len(b) {
			return
		}
		if off >= at && off < at+size {
			binary.LittleEndian.PutUint32(b[at+4:], checksum.Update(checksum.Of(b[at:at+4]), b[at+8:at+size]))
			return
		}
		at += size
	}
}

// walRecordEnd returns the offset after the record of LSN lsn in segment b (the segment's
// header end when lsn is before its first record).
func walRecordEnd(b []byte, lsn uint64) int {
	const hdr = 32
	at := hdr
	for at+hdr <= len(b) {
		n := int(binary.LittleEndian.Uint32(b[at:]))
		if binary.LittleEndian.Uint64(b[at+8:]) > lsn || n == 0 && bytes.Equal(b[at:at+hdr], make([]byte, hdr)) {
			break
		}
		at += hdr + (n+7)&^7
	}
	return at
}

func TestCheckByteFlipSweep(t *testing.T) {
	clean, crash := buildSweepStore(t)
	require.Contains(t, clean, "db/"+mapLogName(1), "the sweep flips the map log's bytes too")
	masks := []byte{0x01, 0x80}
	if testing.Short() {
		masks = masks[:1]
	}
	for _, image := range []struct {
		name  string
		files sweepFiles
	}{{"clean", clean}, {"crash", crash}} {
		t.Run(image.name, func(t *testing.T) {
			base := judgeStore(t, image.files)
			require.NoError(t, base.openErr)
			require.False(t, base.rep.Damaged(), "%v", base.rep.Findings)
			require.False(t, base.readErr, base.state)
			var failures []string
			damaged, flips := 0, 0
			for name, orig := range image.files {
				if strings.HasSuffix(name, "LOCK") {
					continue
				}
				data := strings.HasSuffix(name, ".dat")
				for off := range orig {
					// A data file's mapped pages are under their page-map entries' CRC32C:
					// a stride of them, and every byte of the meta file and the WAL.
					if data && off%61 != 0 {
						continue
					}
					for _, mode := range []string{"raw", "sealed"} {
						if mode == "sealed" && name != "db/meta" && !strings.Contains(name, "/wal/") {
							continue
						}
						ms := masks
						if mode == "sealed" {
							ms = masks[:1] // a writer's bug: one change a byte is enough
						}
						for _, x := range ms {
							flips++
							files := image.files.clone()
							b := files[name]
							b[off] ^= x
							if mode == "sealed" {
								if name == "db/meta" {
									resealMeta(b)
								} else {
									resealWALRecord(b, off)
								}
							}
							o := judgeStore(t, files)
							if o.rep.Damaged() {
								damaged++
							}
							if v := sweepVerdict(o, base.state, mode == "raw"); v != "" {
								failures = append(failures, fmt.Sprintf("%s %s offset %d ^%#x: %s", mode, name, off, x, v))
							}
						}
					}
				}
			}
			// Every file cut short at every length (a data file at a stride of them).
			for name, orig := range image.files {
				if strings.HasSuffix(name, "LOCK") {
					continue
				}
				for n := range orig {
					if strings.HasSuffix(name, ".dat") && n%61 != 0 {
						continue
					}
					files := image.files.clone()
					files[name] = files[name][:n]
					o := judgeStore(t, files)
					// A WAL that ends at a record boundary after the synced LSN looks like a
					// log whose unsynced end was lost, which it may be: it must open.
					strict := true
					if strings.Contains(name, "/wal/") {
						if end := walRecordEnd(orig, base.rep.SyncedLSN); n >= end {
							strict = false
						} else if !o.rep.Damaged() {
							failures = append(failures, fmt.Sprintf("%s cut at %d, before the end %d of the synced LSN %d: no damage: %v",
								name, n, end, base.rep.SyncedLSN, o.rep.Findings))
						}
					}
					if v := sweepVerdict(o, base.state, strict); v != "" {
						failures = append(failures, fmt.Sprintf("%s cut at %d: %s", name, n, v))
					}
				}
			}
			for i, f := range failures {
				if i == 20 {
					t.Logf("... and %d more", len(failures)-20)
					break
				}
				t.Log(f)
			}
			require.Empty(t, failures)
			require.Greater(t, damaged, flips/2, "the sweep damages the store")
		})
	}
}
