package vfs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// requireConsistent checks the invariants of f's tree and files (see node).
func requireConsistent(t *testing.T, f *FaultFS) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	links := map[*node]int{}
	var walk func(d *node, p string)
	walk = func(d *node, p string) {
		replayed := maps.Clone(d.synced)
		for _, op := range d.log {
			applyDirOp(replayed, op)
		}
		require.Equal(t, d.children, replayed, "%s: synced entries + log != entries", p)
		for name, n := range d.children {
			if n.isDir {
				walk(n, p+"/"+name)
				continue
			}
			links[n]++
			requireFileConsistent(t, n, p+"/"+name)
		}
	}
	walk(f.root, "")
	used := int64(0)
	for n, count := range links {
		require.Equal(t, count, n.links, "links")
		used += n.footprint()
	}
	require.Equal(t, used, f.usedBytes, "used bytes")
}

func requireFileConsistent(t *testing.T, n *node, name string) {
	t.Helper()
	size := int64(len(n.data))
	sectors := (size + sectorBytes - 1) / sectorBytes
	unsynced := func(s int64) bool { return hasBit(n.dirty, s) || hasBit(n.lost, s) }
	for s := range int64(len(n.dirty)) * 64 {
		require.False(t, hasBit(n.dirty, s) && hasBit(n.lost, s), "%s: sector %d dirty and lost", name, s)
		require.False(t, s >= sectors && unsynced(s), "%s: sector %d beyond the end is unsynced", name, s)
	}
	for s := range sectors {
		lo, hi := s*sectorBytes, min((s+1)*sectorBytes, size)
		if lo >= int64(len(n.durable)) {
			require.True(t, unsynced(s), "%s: sector %d beyond the durable end is not unsynced", name, s)
			continue
		}
		hi = min(hi, int64(len(n.durable)))
		if !unsynced(s) {
			require.Equal(t, n.durable[lo:hi], n.data[lo:hi], "%s: clean sector %d differs", name, s)
		}
	}
}

func hasBit(set []uint64, i int64) bool {
	return i/64 < int64(len(set)) && set[i/64]&(1<<(i%64)) != 0
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x5eed)) }

// sectorOf returns a sector filled with b.
func sectorOf(b byte) []byte { return bytes.Repeat([]byte{b}, sectorBytes) }

// setupFile creates name in the root directory with content, all durable, and returns it open.
func setupFile(t *testing.T, f *FaultFS, name string, content []byte) File {
	t.Helper()
	file, err := f.Create(name)
	require.NoError(t, err)
	_, err = file.WriteAt(content, 0)
	require.NoError(t, err)
	require.NoError(t, file.Sync())
	require.NoError(t, f.SyncDir("/"))
	return file
}

func TestFaultFSSyncedDataSurvives(t *testing.T) {
	const sectors = 8
	oldBytes := bytes.Repeat([]byte{0xaa}, sectors*sectorBytes)
	newBytes := bytes.Repeat([]byte{0xbb}, sectors*sectorBytes)
	for seed := range uint64(50) {
		f := NewFaultFS()
		file := setupFile(t, f, "f", oldBytes)
		// Sectors 0-3 are rewritten and synced; 4-7 rewritten only; then 4 more appended.
		_, err := file.WriteAt(newBytes[:4*sectorBytes], 0)
		require.NoError(t, err)
		require.NoError(t, file.Sync())
		_, err = file.WriteAt(newBytes[4*sectorBytes:], 4*sectorBytes)
		require.NoError(t, err)
		_, err = file.Write(newBytes[:4*sectorBytes])
		require.NoError(t, err)

		f.Crash(newRand(seed))
		requireConsistent(t, f)
		got, err := f.ReadFile("f")
		require.NoError(t, err)
		require.GreaterOrEqual(t, len(got), sectors*sectorBytes, "seed %d: the synced size stays", seed)
		require.LessOrEqual(t, len(got), 12*sectorBytes, "seed %d", seed)
		require.Equal(t, newBytes[:4*sectorBytes], got[:4*sectorBytes],
			"seed %d: synced data is never lost", seed)
		for s := 4; s < len(got)/sectorBytes; s++ {
			sector := got[s*sectorBytes : (s+1)*sectorBytes]
			switch {
			case s < sectors:
				require.True(t, bytes.Equal(sector, sectorOf(0xaa)) || bytes.Equal(sector, sectorOf(0xbb)),
					"seed %d: sector %d is neither old nor new", seed, s)
			case s < len(got)/sectorBytes-1:
				// Beyond the durable end: a kept sector, or zeros before a kept one.
				require.True(t, bytes.Equal(sector, sectorOf(0xbb)) || bytes.Equal(sector, sectorOf(0)),
					"seed %d: sector %d", seed, s)
			default:
				require.Equal(t, sectorOf(0xbb), sector, "seed %d: the last sector is a kept one", seed)
			}
		}
	}
}

func TestFaultFSCrashNilRngLosesAllUnsynced(t *testing.T) {
	f := NewFaultFS()
	file := setupFile(t, f, "f", []byte("durable"))
	_, err := file.WriteAt([]byte("DUR"), 0)
	require.NoError(t, err)
	_, err = file.Write(bytes.Repeat([]byte("x"), 3000))
	require.NoError(t, err)
	require.NoError(t, file.Truncate(5000))
	f.Crash(nil)
	got, err := f.ReadFile("f")
	require.NoError(t, err)
	require.Equal(t, []byte("durable"), got)
	requireConsistent(t, f)
}

// TestFaultFSCrashKeepsAnySubset checks that crashes keep sector subsets that are not prefixes,
// and also the extremes, each sector whole.
func TestFaultFSCrashKeepsAnySubset(t *testing.T) {
	const sectors = 6
	var nonPrefix, all, none bool
	for seed := uint64(0); seed < 200 && !(nonPrefix && all && none); seed++ {
		f := NewFaultFS()
		file := setupFile(t, f, "f", bytes.Repeat([]byte{0xaa}, sectors*sectorBytes))
		// Writes in reverse order, and misaligned: the sectors dirty are 0..5 all the same.
		for s := sectors - 1; s >= 0; s-- {
			_, err := file.WriteAt(sectorOf(byte(s)), int64(s*sectorBytes))
			require.NoError(t, err)
		}
		f.Crash(newRand(seed))
		got, err := f.ReadFile("f")
		require.NoError(t, err)
		require.Len(t, got, sectors*sectorBytes)
		kept := make([]bool, sectors)
		for s := range sectors {
			sector := got[s*sectorBytes : (s+1)*sectorBytes]
			kept[s] = bytes.Equal(sector, sectorOf(byte(s)))
			require.True(t, kept[s] || bytes.Equal(sector, sectorOf(0xaa)),
				"seed %d: sector %d torn", seed, s)
		}
		first := slices.Index(kept, false)
		nonPrefix = nonPrefix || (first >= 0 && slices.Contains(kept[first:], true))
		all = all || first < 0
		none = none || !slices.Contains(kept, true)
	}
	require.True(t, nonPrefix, "no seed kept a later sector but dropped an earlier one")
	require.True(t, all, "no seed kept every sector")
	require.True(t, none, "no seed dropped every sector")
}

func TestFaultFSCrashSizeRule(t *testing.T) {
	sizes := map[int]bool{}
	for seed := range uint64(60) {
		f := NewFaultFS()
		file := setupFile(t, f, "f", bytes.Repeat([]byte{1}, 1000))
		// Far beyond the end: the zero gap [1000, 4096) is unsynced too.
		_, err := file.WriteAt([]byte("tail"), 4096)
		require.NoError(t, err)
		f.Crash(newRand(seed))
		got, err := f.ReadFile("f")
		require.NoError(t, err)
		sizes[len(got)] = true
		switch {
		case len(got) == 4100:
			require.Equal(t, []byte("tail"), got[4096:], "the size extends to the kept sector's end")
			require.Equal(t, make([]byte, 4096-1000), got[1000:4096], "the gap reads as zeros")
		case len(got) > 1000:
			require.Zero(t, len(got)%sectorBytes, "seed %d: a kept gap sector ends the file", seed)
			require.Equal(t, make([]byte, len(got)-1000), got[1000:])
		default:
			require.Len(t, got, 1000)
		}
		require.Equal(t, bytes.Repeat([]byte{1}, 1000), got[:1000])
	}
	require.True(t, sizes[1000], "no seed kept the durable size")
	require.True(t, sizes[4100], "no seed kept the tail")
}

func TestFaultFSUnsyncedTruncateReverts(t *testing.T) {
	f := NewFaultFS()
	file := setupFile(t, f, "f", bytes.Repeat([]byte{7}, 2000))
	require.NoError(t, file.Truncate(700))
	_, err := file.Write([]byte{9, 9}) // dirty sector 1, partly
	require.NoError(t, err)
	for seed := range uint64(20) {
		g := NewFaultFS()
		gf := setupFile(t, g, "f", bytes.Repeat([]byte{7}, 2000))
		require.NoError(t, gf.Truncate(700))
		_, err := gf.Write([]byte{9, 9})
		require.NoError(t, err)
		g.Crash(newRand(seed))
		requireConsistent(t, g)
		got, err := g.ReadFile("f")
		require.NoError(t, err)
		require.Len(t, got, 2000, "an unsynced shrink is undone")
		require.Equal(t, bytes.Repeat([]byte{7}, 512), got[:512])
		if got[700] == 9 { // sector 1 kept: the bytes past the end it was written with are zero
			require.Equal(t, append(bytes.Repeat([]byte{7}, 700-512), 9, 9), got[512:702])
			require.Equal(t, make([]byte, 1024-702), got[702:1024])
		} else {
			require.Equal(t, bytes.Repeat([]byte{7}, 2000), got)
		}
	}
	require.NoError(t, file.Sync())
	f.Crash(newRand(1))
	got, err := f.ReadFile("f")
	require.NoError(t, err)
	require.Equal(t, append(bytes.Repeat([]byte{7}, 700), 9, 9), got, "a synced shrink stays")
}

func TestFaultFSEntriesNeedSyncDir(t *testing.T) {
	t.Run("rename", func(t *testing.T) {
		for _, syncDir := range []bool{false, true} {
			f := NewFaultFS()
			require.NoError(t, f.MkdirAll("db"))
			require.NoError(t, f.SyncDir("/"))
			writeFile(t, f, "db/cur", []byte("v1"))
			writeFile(t, f, "db/cur.tmp", []byte("v2"))
			require.NoError(t, f.SyncDir("db"))
			require.NoError(t, f.Rename("db/cur.tmp", "db/cur"))
			if syncDir {
				require.NoError(t, f.SyncDir("db"))
			}
			f.Crash(newRand(1))
			requireConsistent(t, f)
			names, err := f.List("db")
			require.NoError(t, err)
			if syncDir {
				require.Equal(t, []string{"cur"}, names)
				require.Equal(t, []byte("v2"), contentOf(t, f, "db/cur"))
			} else {
				require.Equal(t, []string{"cur", "cur.tmp"}, names, "the rename is undone")
				require.Equal(t, []byte("v1"), contentOf(t, f, "db/cur"))
				require.Equal(t, []byte("v2"), contentOf(t, f, "db/cur.tmp"))
			}
		}
	})
	t.Run("create", func(t *testing.T) {
		f := NewFaultFS()
		writeFile(t, f, "a", []byte("a"))
		require.NoError(t, f.SyncDir("/"))
		writeFile(t, f, "b", []byte("b")) // synced content, unsynced entry
		require.NoError(t, f.MkdirAll("d/e"))
		f.Crash(newRand(1))
		names, err := f.List("/")
		require.NoError(t, err)
		require.Equal(t, []string{"a"}, names)
	})
	t.Run("remove", func(t *testing.T) {
		f := NewFaultFS()
		writeFile(t, f, "a", []byte("a"))
		writeFile(t, f, "b", []byte("b"))
		require.NoError(t, f.SyncDir("/"))
		require.NoError(t, f.Remove("a"))
		require.NoError(t, f.Remove("b"))
		require.NoError(t, f.SyncDir("/"))
		writeFile(t, f, "b", []byte("new b"))
		require.NoError(t, f.Remove("b"))
		f.Crash(newRand(1))
		names, err := f.List("/")
		require.NoError(t, err)
		require.Empty(t, names)

		writeFile(t, f, "c", []byte("c"))
		require.NoError(t, f.SyncDir("."))
		require.NoError(t, f.Remove("c"))
		f.Crash(nil)
		require.Equal(t, []byte("c"), contentOf(t, f, "c"), "an unsynced removal is undone")
		require.EqualValues(t, 1, f.Used())
	})
	t.Run("rename-across-directories", func(t *testing.T) {
		f := NewFaultFS()
		require.NoError(t, f.MkdirAll("x"))
		require.NoError(t, f.MkdirAll("y"))
		writeFile(t, f, "x/f", []byte("f"))
		require.NoError(t, f.SyncDir("x"))
		require.NoError(t, f.SyncDir("/"))
		require.NoError(t, f.Rename("x/f", "y/f"))
		require.NoError(t, f.SyncDir("y")) // only the new side synced: the file has two names
		f.Crash(nil)
		requireConsistent(t, f)
		require.Equal(t, []byte("f"), contentOf(t, f, "x/f"))
		require.Equal(t, []byte("f"), contentOf(t, f, "y/f"))
		require.EqualValues(t, 1, f.Used(), "one file, counted once")
		require.NoError(t, f.Remove("x/f"))
		require.EqualValues(t, 1, f.Used(), "still named once")
		require.NoError(t, f.Remove("y/f"))
		require.Zero(t, f.Used())
	})
}

func TestFaultFSCrashPartialEntries(t *testing.T) {
	outcomes := map[string]bool{}
	for seed := uint64(0); seed < 100 && len(outcomes) < 4; seed++ {
		f := NewFaultFS()
		writeFile(t, f, "cur", []byte("v1"))
		require.NoError(t, f.SyncDir("/"))
		writeFile(t, f, "tmp", []byte("v2"))
		require.NoError(t, f.Rename("tmp", "cur"))
		require.NoError(t, f.Remove("cur"))
		f.CrashPartialEntries(newRand(seed))
		requireConsistent(t, f)
		names, err := f.List("/")
		require.NoError(t, err)
		var state []string
		for _, n := range names {
			state = append(state, n+"="+string(contentOf(t, f, n)))
		}
		outcomes[fmt.Sprint(state)] = true
	}
	// Each prefix of create tmp, rename tmp->cur, remove cur; never a state no prefix gives.
	require.Equal(t, map[string]bool{
		"[cur=v1]":        true,
		"[cur=v1 tmp=v2]": true,
		"[cur=v2]":        true,
		"[]":              true,
	}, outcomes)
}

func TestFaultFSDiskFull(t *testing.T) {
	f := NewFaultFS()
	f.SetCapacity(4096)
	file, err := f.Create("f")
	require.NoError(t, err)
	_, err = file.Write(make([]byte, 3000))
	require.NoError(t, err)
	n, err := file.Write(bytes.Repeat([]byte{1}, 2000))
	require.ErrorIs(t, err, syscall.ENOSPC)
	var pathErr *fs.PathError
	require.ErrorAs(t, err, &pathErr)
	require.Equal(t, 1096, n, "the bytes up to the last whole sector that fits are written")
	size, err := file.Size()
	require.NoError(t, err)
	require.EqualValues(t, 4096, size)
	require.EqualValues(t, 4096, f.Used())
	_, err = file.WriteAt([]byte{2}, 100)
	require.NoError(t, err, "overwriting needs no space")

	require.ErrorIs(t, file.Truncate(4097), syscall.ENOSPC)
	require.ErrorIs(t, file.Allocate(0, 8192), syscall.ENOSPC)
	require.NoError(t, file.Truncate(1000))
	require.NoError(t, file.Allocate(0, 2000))
	require.EqualValues(t, 2000, f.Used())

	g, err := f.Create("g")
	require.NoError(t, err)
	n, err = g.WriteAt(make([]byte, 3000), 100) // room 2096: whole sectors up to 2048
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.Equal(t, 2048-100, n)
	n, err = g.WriteAt([]byte{1}, 10000)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.Zero(t, n)

	require.NoError(t, f.Remove("f"))
	require.EqualValues(t, 2048, f.Used(), "a removed file's space is free")
	require.NoError(t, file.Close())
	require.NoError(t, g.Close())
	requireConsistent(t, f)
}

func TestFaultFSSetFailAt(t *testing.T) {
	f := NewFaultFS()
	file, err := f.Create("f")
	require.NoError(t, err)
	errCustom := errors.New("custom")
	f.SetFailAt(OpWrite, 3, nil)
	f.SetFailAt(OpSync, 2, errCustom)
	for i, s := range []string{"a", "b", "c", "d"} {
		_, err := file.Write([]byte(s))
		if i == 2 {
			require.ErrorIs(t, err, syscall.EIO, "the third write")
			var pathErr *fs.PathError
			require.ErrorAs(t, err, &pathErr)
			require.Equal(t, "write", pathErr.Op)
		} else {
			require.NoError(t, err)
		}
	}
	require.Equal(t, []byte("abd"), readAll(t, file), "a failed write writes nothing")
	require.NoError(t, file.Sync())
	require.ErrorIs(t, file.Sync(), errCustom, "the second sync")
	require.NoError(t, file.Sync(), "a rule fires once")

	f.SetFailAt(OpSyncDir, 1, nil)
	require.ErrorIs(t, f.SyncDir("/"), syscall.EIO)
	f.Crash(nil)
	_, err = f.Open("f")
	require.ErrorIs(t, err, fs.ErrNotExist, "the failed SyncDir made nothing durable")
}

// TestFaultFSFailedSyncLosesData checks the fsync-error model: the writes a failed Sync covered
// never become durable, even when a later Sync succeeds.
func TestFaultFSFailedSyncLosesData(t *testing.T) {
	for seed := range uint64(20) {
		f := NewFaultFS()
		file := setupFile(t, f, "f", sectorOf('o'))
		_, err := file.WriteAt(sectorOf('n'), 0)
		require.NoError(t, err)
		_, err = file.Write(sectorOf('a'))
		require.NoError(t, err)
		f.SetFailAt(OpSync, 1, nil)
		require.ErrorIs(t, file.Sync(), syscall.EIO)
		require.Equal(t, append(sectorOf('n'), sectorOf('a')...), readAll(t, file),
			"the page cache still has it")
		require.NoError(t, file.Sync(), "a retried sync succeeds, as on Linux")
		requireConsistent(t, f)
		f.Crash(newRand(seed))
		got, err := f.ReadFile("f")
		require.NoError(t, err)
		require.Equal(t, append(sectorOf('o'), make([]byte, sectorBytes)...), got,
			"seed %d: the old bytes, and the synced size over a never-written sector", seed)
	}
}

// TestFaultFSFsyncgateRestart checks the model across a process restart: after a failed Sync
// the dropped pages stay readable (the OS page cache survives kill -9) until the next power
// loss, which takes them; only writing them again makes a later Sync persist them.
func TestFaultFSFsyncgateRestart(t *testing.T) {
	for _, rewrite := range []bool{false, true} {
		f := NewFaultFS()
		file := setupFile(t, f, "f", sectorOf('o'))
		_, err := file.WriteAt(sectorOf('n'), 0)
		require.NoError(t, err)
		f.SetFailAt(OpSync, 1, nil)
		require.ErrorIs(t, file.Sync(), syscall.EIO)
		f.CrashKeepAll()
		file, err = f.Open("f")
		require.NoError(t, err)
		require.Equal(t, sectorOf('n'), readAll(t, file), "readable after the restart")
		if rewrite {
			_, err = file.WriteAt(readAll(t, file), 0)
			require.NoError(t, err)
		}
		require.NoError(t, file.Sync())
		requireConsistent(t, f)
		f.Crash(nil)
		got, err := f.ReadFile("f")
		require.NoError(t, err)
		want := sectorOf('o')
		if rewrite {
			want = sectorOf('n')
		}
		require.Equal(t, want, got, "rewrite %v", rewrite)
	}
}

func TestFaultFSInject(t *testing.T) {
	f := NewFaultFS()
	var seen []string
	errNo := errors.New("no")
	f.Inject(func(op Op) error {
		seen = append(seen, op.String())
		if op.Kind == OpRename && op.NewName == "b/final" {
			return errNo
		}
		return nil
	})
	require.NoError(t, f.MkdirAll("/b"))
	file, err := f.Create("b/tmp")
	require.NoError(t, err)
	_, err = file.WriteAt([]byte("xyz"), 7)
	require.NoError(t, err)
	require.NoError(t, file.Truncate(5))
	require.NoError(t, file.Close())
	err = f.Rename("b/tmp", "b/final")
	require.ErrorIs(t, err, errNo)
	f.Inject(nil)
	require.NoError(t, f.Rename("b/tmp", "b/final"))
	require.Equal(t, []string{
		"mkdir b #1", "create b/tmp #2", "write b/tmp [7,+3) #3", "truncate b/tmp to 5 #4",
		"close b/tmp", "rename b/tmp -> b/final #5",
	}, seen)
	require.EqualValues(t, 6, f.Ops())
}

// TestFaultFSInjectBlocks checks that an Inject function that blocks (a stuck disk) stalls its
// own operation only.
func TestFaultFSInjectBlocks(t *testing.T) {
	f := NewFaultFS()
	a := setupFile(t, f, "a", []byte("a"))
	b := setupFile(t, f, "b", []byte("b"))
	entered, gate := make(chan struct{}), make(chan struct{})
	f.Inject(func(op Op) error {
		if op.Kind == OpSync && op.Name == "a" {
			close(entered)
			<-gate
		}
		return nil
	})
	done := make(chan error, 1)
	go func() { done <- a.Sync() }()
	<-entered
	_, err := b.Write([]byte("+"))
	require.NoError(t, err)
	require.NoError(t, b.Sync())
	require.Equal(t, []byte("a"), readAll(t, a))
	close(gate)
	require.NoError(t, <-done)
}

// TestFaultFSInjectCrashes loses power in the middle of a Sync, from the Inject function.
func TestFaultFSInjectCrashes(t *testing.T) {
	f := NewFaultFS()
	file := setupFile(t, f, "f", []byte("synced"))
	_, err := file.Write([]byte("+lost"))
	require.NoError(t, err)
	f.Inject(func(op Op) error {
		if op.Kind == OpSync {
			f.Crash(nil)
		}
		return nil
	})
	require.ErrorIs(t, file.Sync(), ErrCrashed)
	require.Equal(t, []byte("synced"), contentOf(t, f, "f"))
	requireConsistent(t, f)
}

func TestFaultFSHandlesFailAfterCrash(t *testing.T) {
	for _, crash := range []struct {
		name string
		do   func(f *FaultFS)
	}{
		{"power-loss", func(f *FaultFS) { f.Crash(newRand(7)) }},
		{"kill", (*FaultFS).CrashKeepAll},
	} {
		t.Run(crash.name, func(t *testing.T) {
			f := NewFaultFS()
			file := setupFile(t, f, "f", []byte("synced"))
			_, err := file.Write([]byte("+unsynced"))
			require.NoError(t, err)
			lock, err := f.Lock("LOCK")
			require.NoError(t, err)
			f.SetFailAt(OpOpen, 1, nil)

			crash.do(f)
			_, err = file.ReadAt(make([]byte, 1), 0)
			require.ErrorIs(t, err, ErrCrashed)
			_, err = file.Write([]byte("x"))
			require.ErrorIs(t, err, ErrCrashed)
			require.ErrorIs(t, file.Sync(), ErrCrashed)
			_, err = file.Size()
			require.ErrorIs(t, err, ErrCrashed)
			require.ErrorIs(t, file.Close(), ErrCrashed)
			require.ErrorIs(t, file.Close(), os.ErrClosed)

			// The rebooted disk: healthy (the fault is gone), unlocked, usable.
			again, err := f.Lock("LOCK")
			require.NoError(t, err, "a crash releases locks")
			require.NoError(t, lock.Close(), "closing a lock of before does nothing")
			_, err = f.Lock("LOCK")
			require.ErrorIs(t, err, ErrLocked, "and does not release the new one")
			require.NoError(t, again.Close())
			got := contentOf(t, f, "f")
			if crash.name == "kill" {
				require.Equal(t, []byte("synced+unsynced"), got, "kill -9 loses nothing")
				f.Crash(nil)
				require.Equal(t, []byte("synced"), contentOf(t, f, "f"), "but made nothing durable")
			} else {
				require.True(t, bytes.HasPrefix(got, []byte("synced")))
			}
			requireConsistent(t, f)
		})
	}
}

// atomicReplace is the protocol the storage engine publishes a file with: write a temporary
// file, sync it, rename it over the old one, sync the directory.
func atomicReplace(fsys FS, name string, data []byte) error {
	tmp := name + ".tmp"
	f, err := fsys.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := fsys.Rename(tmp, name); err != nil {
		return err
	}
	return fsys.SyncDir(".")
}

// TestFaultFSCrashPoints crashes the atomic replace after each of its operations in turn, with
// several power-loss outcomes each, and checks that the file always holds the old or the new
// content whole, and the new one once the replace returned.
func TestFaultFSCrashPoints(t *testing.T) {
	oldData := bytes.Repeat([]byte("old."), 300) // several sectors
	newData := bytes.Repeat([]byte("NEW!"), 400)
	setup := func() *FaultFS {
		f := NewFaultFS()
		writeFile(t, f, "manifest", oldData)
		require.NoError(t, f.SyncDir("/"))
		return f
	}
	probe := setup()
	before := probe.Ops()
	require.NoError(t, atomicReplace(probe, "manifest", newData))
	total := probe.Ops() - before
	require.EqualValues(t, 5, total, "create, write, sync, rename, syncdir")

	for k := int64(0); ; k++ {
		for seed := range uint64(8) {
			f := setup()
			f.SetCrashPoint(k)
			err := atomicReplace(f, "manifest", newData)
			reached := f.CrashPointReached()
			require.Equal(t, err != nil, reached && k < total, "k=%d", k)
			if err != nil {
				require.ErrorIs(t, err, ErrCrashed, "k=%d", k)
			}
			f.CrashPartialEntries(newRand(seed))
			requireConsistent(t, f)
			got := contentOf(t, f, "manifest")
			if err == nil {
				require.Equal(t, newData, got, "k=%d seed=%d: acknowledged, so durable", k, seed)
			} else {
				require.True(t, bytes.Equal(got, oldData) || bytes.Equal(got, newData),
					"k=%d seed=%d: a mixture", k, seed)
			}
		}
		if k >= total {
			break
		}
	}
}

// TestFaultFSConcurrentCrash crashes the FS while goroutines write and sync: each must stop on
// ErrCrashed, and the race detector must stay quiet.
func TestFaultFSConcurrentCrash(t *testing.T) {
	f := NewFaultFS()
	const workers = 4
	files := make([]File, workers)
	for w := range workers {
		files[w] = setupFile(t, f, fmt.Sprintf("f%d", w), nil)
	}
	started := make(chan struct{}, workers)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				if _, err := files[w].Write(sectorOf(byte(i))); err != nil {
					errs <- err
					return
				}
				if err := files[w].Sync(); err != nil {
					errs <- err
					return
				}
				if i == 10 {
					started <- struct{}{}
				}
			}
		})
	}
	for range workers {
		<-started
	}
	f.Crash(newRand(3))
	wg.Wait()
	close(errs)
	for err := range errs {
		require.ErrorIs(t, err, ErrCrashed)
	}
	requireConsistent(t, f)
	for w := range workers {
		got, err := f.ReadFile(fmt.Sprintf("f%d", w))
		require.NoError(t, err)
		require.GreaterOrEqual(t, len(got), 11*sectorBytes, "the synced sectors survive")
		for s := range len(got) / sectorBytes {
			require.Equal(t, sectorOf(byte(s)), got[s*sectorBytes:(s+1)*sectorBytes])
		}
	}
}

// TestFaultFSModel runs random file operations and crashes against a model of the durability
// contract: after a crash each sector holds its synced bytes or its newest bytes, and a file
// with no write since its last Sync comes back exactly as synced. The seed replays a failure.
func TestFaultFSModel(t *testing.T) {
	for seed := range uint64(30) {
		runModel(t, seed)
	}
}

func runModel(t *testing.T, seed uint64) {
	rng := newRand(seed)
	f := NewFaultFS()
	file := setupFile(t, f, "f", nil)
	var synced, current []byte // the model
	for step := range 300 {
		switch op := rng.IntN(10); {
		case op < 5:
			data := make([]byte, 1+rng.IntN(1500))
			for i := range data {
				data[i] = byte(1 + rng.IntN(255))
			}
			off := int64(rng.IntN(4000))
			_, err := file.WriteAt(data, off)
			require.NoError(t, err)
			current = resize(current, max(int64(len(current)), off+int64(len(data))))
			copy(current[off:], data)
		case op < 6:
			size := int64(rng.IntN(5000))
			require.NoError(t, file.Truncate(size))
			current = resize(current, size)
		case op < 8:
			require.NoError(t, file.Sync())
			synced = slices.Clone(current)
		case op < 9:
			f.Crash(rng)
			requireConsistent(t, f)
			got, err := f.ReadFile("f")
			require.NoError(t, err, "seed %d step %d", seed, step)
			requireCrashOutcome(t, got, synced, current, fmt.Sprintf("seed %d step %d", seed, step))
			synced, current = got, slices.Clone(got)
			file, err = f.Open("f")
			require.NoError(t, err)
		default:
			got := readAll(t, file)
			require.True(t, bytes.Equal(current, got), "seed %d step %d", seed, step)
		}
	}
	requireConsistent(t, f)
}

// requireCrashOutcome checks got against the model: each sector is the synced one or the
// newest one (zero-padded past the newest end), and the size is the synced size, or the end of
// a newest sector beyond it.
func requireCrashOutcome(t *testing.T, got, synced, current []byte, where string) {
	t.Helper()
	require.GreaterOrEqual(t, len(got), len(synced), where)
	if len(got) > len(synced) {
		require.LessOrEqual(t, len(got), len(current), where)
		require.True(t, len(got) == len(current) || len(got)%sectorBytes == 0,
			"%s: size %d", where, len(got))
	}
	sectorAt := func(b []byte, s int) []byte {
		sector := make([]byte, sectorBytes)
		if lo := s * sectorBytes; lo < len(b) {
			copy(sector, b[lo:])
		}
		return sector
	}
	for s := 0; s*sectorBytes < len(got); s++ {
		g := sectorAt(got, s)
		oldS, newS := sectorAt(synced, s), sectorAt(current, s)
		// The crash result is cut at its own size, so compare that far.
		n := min(sectorBytes, len(got)-s*sectorBytes)
		require.True(t, bytes.Equal(g[:n], oldS[:n]) || bytes.Equal(g[:n], newS[:n]),
			"%s: sector %d is neither synced nor newest", where, s)
	}
}

// SetOutOfFiles fails what opens a descriptor (as EMFILE), not what uses an open File, and
// ResetFaults ends it.
func TestFaultFSOutOfFiles(t *testing.T) {
	fs := NewFaultFS()
	f, err := fs.Create("a")
	require.NoError(t, err)
	fs.SetOutOfFiles(true)
	_, err = fs.Create("b")
	require.ErrorIs(t, err, syscall.EMFILE)
	_, err = fs.Open("a")
	require.ErrorIs(t, err, syscall.EMFILE)
	require.ErrorIs(t, fs.SyncDir("."), syscall.EMFILE)
	_, err = fs.List(".")
	require.ErrorIs(t, err, syscall.EMFILE)
	_, err = f.WriteAt([]byte("x"), 0)
	require.NoError(t, err, "an open file is written")
	require.NoError(t, f.Sync())
	require.NoError(t, fs.Rename("a", "c"), "a rename opens nothing")
	fs.ResetFaults()
	_, err = fs.Open("c")
	require.NoError(t, err)
}
