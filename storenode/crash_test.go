package storenode

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/internal/testseed"
	"github.com/weftdb/weft/logicpage"
)

// kill -9. The test binary runs itself as a writer (TestHelperWriter, selected by
// killChildEnv): it opens the store in a real directory, creates or reopens a table, takes its
// ownership and commits batches from 64 goroutines that share one owner. Each goroutine owns 8
// rows on 8 different pages and writes all of them in every batch, each row holding (writer,
// seq, row index, filler, checksum); seqs are assigned and batches handed to Commit under one
// mutex, so the owner's seq order is the commit order. Every acknowledged batch is printed as
// "ack <writer> <seq>" once its done callback reported success.
//
// The parent kills the writer with SIGKILL after a random number of acks (sometimes while it
// is still opening the store, i.e. during recovery), then checks every row: a valid checksum,
// its writer's rows all at one seq (no batch half applied), that seq at least the writer's
// last acknowledged seq and at most the owner's recovered last seq. Even cycles verify in the
// parent (open in-process, check, close); odd cycles leave the killed store as it is and the
// next writer verifies it at startup before writing (the parent passes the acks it saw). The
// next writer resumes above the owner's recovered seq. Cycles alternate SyncAlways and
// SyncNone (both must survive kill -9). A small cache and a small CheckpointWALBytes make
// checkpoints run all the time, so kills land inside them.

const (
	killChildEnv     = "WEFT_KILL_CHILD" // set in the writer child: its store directory
	killSyncEnv      = "WEFT_KILL_SYNC"  // "always" or "none"
	killExpectEnv    = "WEFT_KILL_EXPECT"
	killSmallEnv     = "WEFT_KILL_SMALL_CACHE"
	killWriters      = 64
	killRowsPerBatch = 8
	killOwner        = 1
	killTable        = "kill"
	killRowBytesEnv  = "WEFT_KILL_ROW_BYTES"
	killGrantPages   = killRowsPerBatch * 8 // the pages killRowID spans
)

// killRowBytes is the kill table's row size: 64, or 256 in TestKill9KeptRows (rows the WAL
// writes from the batch, kept pieces, in the group's pwritev); the child reads it from
// killRowBytesEnv. A row's first 64 bytes are killRow's, the rest zero.
var killRowBytes = 64

// killRowID is the id of row j of writer w: slot w of page j*8 + w%8, so a batch spans 8
// pages and every page holds rows of 8 writers.
func killRowID(w, j int) uint64 {
	return uint64(j*8+w%8)*logicpage.RowsPerPage + uint64(w)
}

func killRow(dst []byte, w, j int, seq uint64) {
	binary.LittleEndian.PutUint64(dst[0:], uint64(w))
	binary.LittleEndian.PutUint64(dst[8:], seq)
	binary.LittleEndian.PutUint64(dst[16:], uint64(j))
	fillRow(dst[24:56], uint32(w), uint64(j), seq)
	binary.LittleEndian.PutUint64(dst[56:], uint64(checksum.Of(dst[:56])))
}

// killOptions are the writer's options. A cache smaller than the 64 pages the writers touch
// makes every commit that misses wait for a checkpoint to clean frames (and reads merge
// partial frames); a larger one lets the writers run at WAL speed, checkpointing by WAL
// growth and by time.
func killOptions(dir string, sync SyncMode, small bool) Options {
	cacheBytes := int64(512 << 10)
	if small {
		cacheBytes = 160 << 10
	}
	scale := int64(killRowBytes / 64) // the same number of pages and records at any row size
	return Options{
		Dir:                dir,
		Sync:               sync,
		CacheBytes:         cacheBytes * scale,
		CheckpointWALBytes: 32 << 10 * scale,
		CheckpointInterval: 20 * time.Millisecond,
		WALSegmentBytes:    256 << 10,
		Logger:             quietLogger,
	}
}

// verifyKillRows checks the writers' rows against the last acknowledged seq of each writer
// (0: none seen) and the owner's recovered last seq.
func verifyKillRows(e *Engine, table uint32, lastAck []uint64, ownerSeq uint64) error {
	pages := make(map[uint64][]byte)
	presents := make(map[uint64]uint64)
	var total uint64
	for page := range uint64(killRowsPerBatch * 8) {
		data, _, rows, err := e.ReadRows(table, page, ^uint64(0), nil)
		if err != nil {
			return fmt.Errorf("read page %d: %w", page, err)
		}
		pages[page], presents[page] = rows, data
		total += uint64(bits.OnesCount64(data))
	}
	for _, ti := range e.Tables() {
		if ti.ID == table && ti.Rows != total {
			return fmt.Errorf("table holds %d rows, the writers' pages %d", ti.Rows, total)
		}
	}
	for w := range killWriters {
		var seq uint64
		present := 0
		for j := range killRowsPerBatch {
			id := killRowID(w, j)
			page, slot := logicpage.PageOf(id)
			if presents[page]&(1<<slot) == 0 {
				continue
			}
			present++
			k := bits.OnesCount64(presents[page] & (1<<slot - 1))
			row := pages[page][k*killRowBytes : (k+1)*killRowBytes]
			if got := binary.LittleEndian.Uint64(row[56:]); got != uint64(checksum.Of(row[:56])) {
				return fmt.Errorf("writer %d row %d (id %d): bad checksum", w, j, id)
			}
			if gw, gj := binary.LittleEndian.Uint64(row[0:]), binary.LittleEndian.Uint64(row[16:]); gw != uint64(w) || gj != uint64(j) {
				return fmt.Errorf("writer %d row %d (id %d): holds writer %d row %d", w, j, id, gw, gj)
			}
			s := binary.LittleEndian.Uint64(row[8:])
			if present > 1 && s != seq {
				return fmt.Errorf("writer %d: row %d has seq %d, the rows before it seq %d: a batch half applied", w, j, s, seq)
			}
			seq = s
		}
		switch {
		case present != 0 && present != killRowsPerBatch:
			return fmt.Errorf("writer %d: %d of %d rows present: a batch half applied", w, present, killRowsPerBatch)
		case present == 0 && lastAck[w] > 0:
			return fmt.Errorf("writer %d: rows missing, seq %d was acknowledged", w, lastAck[w])
		case seq < lastAck[w]:
			return fmt.Errorf("writer %d: rows at seq %d, seq %d was acknowledged", w, seq, lastAck[w])
		case seq > ownerSeq:
			return fmt.Errorf("writer %d: rows at seq %d, beyond the owner's last seq %d", w, seq, ownerSeq)
		}
	}
	return nil
}

// openKillTable opens (or creates) the writers' table and takes its ownership.
func openKillTable(e *Engine) (uint32, base.Grant, error) {
	info, err := e.OpenTable(killTable)
	if err != nil {
		if info, err = e.CreateTable(killTable, killRowBytes); err != nil {
			return 0, base.Grant{}, err
		}
	}
	g, err := e.Acquire(info.ID, killOwner, 0)
	if err != nil {
		return 0, base.Grant{}, err
	}
	_, err = grantPages(e, info.ID, killOwner, g.Epoch, killGrantPages)
	return info.ID, g, err
}

// TestHelperWriter is the writer child of TestKill9; without killChildEnv it does nothing.
func TestHelperWriter(t *testing.T) {
	dir := testkit.HelperSpec(t, killChildEnv, "TestKill9")
	out := bufio.NewWriter(os.Stdout)
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(out, format+"\n", args...)
		if err := out.Flush(); err != nil {
			os.Exit(4) // the parent is gone
		}
	}
	fail := func(format string, args ...any) {
		say("fail "+format, args...)
		os.Exit(3)
	}
	// Bounded even if the parent dies without killing it.
	time.AfterFunc(2*time.Minute, func() { os.Exit(5) })

	mode, _ := ParseSyncMode(os.Getenv(killSyncEnv))
	if rb, err := strconv.Atoi(os.Getenv(killRowBytesEnv)); err == nil {
		killRowBytes = rb
	}
	say("open")
	e, err := Open(killOptions(dir, mode, os.Getenv(killSmallEnv) != ""))
	if err != nil {
		fail("open: %v", err)
	}
	// Small lock holds: kills land between a checkpoint's chunks too.
	e.ckptChunk = ckptChunks{scanFrames: 7, copyBytes: 3 * 4096, installWrites: 5}
	table, g, err := openKillTable(e)
	if err != nil {
		fail("table: %v", err)
	}
	if expect := os.Getenv(killExpectEnv); expect != "" {
		lastAck := make([]uint64, killWriters)
		for w, f := range strings.Split(expect, ",") {
			lastAck[w], _ = strconv.ParseUint(f, 10, 64)
		}
		if err := verifyKillRows(e, table, lastAck, g.LastSeq); err != nil {
			fail("verify at startup: %v", err)
		}
	}
	say("ready %d", g.LastSeq)

	var commitMu sync.Mutex
	nextSeq := g.LastSeq + 1
	fences := []base.Fence{{Table: table, Epoch: g.Epoch}}
	var acks atomic.Uint64
	for w := range killWriters {
		go func() {
			done := make(chan error, 1)
			rows := make([]byte, killRowsPerBatch*killRowBytes)
			segs := make([]base.Segment, killRowsPerBatch)
			for {
				commitMu.Lock()
				seq := nextSeq
				nextSeq++
				for j := range killRowsPerBatch {
					row := rows[j*killRowBytes : (j+1)*killRowBytes]
					killRow(row, w, j, seq)
					page, slot := logicpage.PageOf(killRowID(w, j))
					segs[j] = base.Segment{Table: table, Page: page, Data: 1 << slot, Rows: row}
				}
				e.Commit(&base.Batch{Owner: killOwner, Seq: seq, Fences: fences, Segments: segs}, func(_ uint64, err error) { done <- err })
				commitMu.Unlock()
				if err := <-done; err != nil {
					fail("commit seq %d: %v", seq, err)
				}
				say("ack %d %d", w, seq)
				if acks.Add(1)%128 == 0 {
					say("checkpoints %d", e.Stats().Checkpoints)
				}
			}
		}()
	}
	select {} // until killed
}

// killCycle runs one writer child until it has printed target acks (or, with target < 0,
// until it starts opening the store), kills it, and folds the acks it printed into lastAck.
func killCycle(t *testing.T, dir string, mode SyncMode, small bool, target int, expect []uint64, lastAck []uint64) (acks, checkpoints int) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWriter$", "-test.count=1")
	cmd.Env = append(os.Environ(), killChildEnv+"="+dir, killSyncEnv+"="+mode.String(), killRowBytesEnv+"="+strconv.Itoa(killRowBytes))
	if small {
		cmd.Env = append(cmd.Env, killSmallEnv+"=1")
	}
	if expect != nil {
		fields := make([]string, len(expect))
		for w, s := range expect {
			fields[w] = strconv.FormatUint(s, 10)
		}
		cmd.Env = append(cmd.Env, killExpectEnv+"="+strings.Join(fields, ","))
	}
	child := testkit.StartChild(t, cmd, 45*time.Second)
	defer child.Stop() // a failed check must not leave the child running
	stdout, stderr, kill := child.Stdout, child.Stderr, child.Kill

	sc := bufio.NewScanner(stdout)
	ready := false
	var failure string
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 0:
		case f[0] == "open":
			if target < 0 {
				kill()
			}
		case f[0] == "ready":
			ready = true
			if target == 0 {
				kill()
			}
		case f[0] == "ack" && len(f) == 3:
			w, _ := strconv.Atoi(f[1])
			seq, _ := strconv.ParseUint(f[2], 10, 64)
			require.Greater(t, seq, lastAck[w], "writer %d acknowledged seqs go up", w)
			lastAck[w] = seq
			if acks++; acks == target {
				kill()
			}
		case f[0] == "checkpoints" && len(f) == 2:
			checkpoints, _ = strconv.Atoi(f[1])
		case f[0] == "fail":
			failure = sc.Text()
		}
	}
	err := cmd.Wait()
	if failure != "" {
		t.Fatalf("writer child: %s\nstderr:\n%s", failure, stderr.String())
	}
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "writer child ended on its own: %v\nstderr:\n%s", err, stderr.String())
	ws, ok := exit.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "writer child: %v\nstderr:\n%s", err, stderr.String())
	require.False(t, target > 0 && ready && acks < target, "killed by the timeout after %d of %d acks", acks, target)
	return acks, checkpoints
}

func TestKill9(t *testing.T) {
	if os.Getenv(killChildEnv) != "" {
		t.Skip("in the writer child")
	}
	runKill9(t, testseed.Scaled(8, 40, 400))
}

// TestKill9KeptRows is TestKill9 with rows of 256 bytes: each row is a run the WAL writes
// from the writer's batch (a kept piece, gathered into the group's pwritev on the real file
// system), so kills land inside those writes.
func TestKill9KeptRows(t *testing.T) {
	if os.Getenv(killChildEnv) != "" {
		t.Skip("in the writer child")
	}
	require.GreaterOrEqual(t, 256, commitKeepBytesMin)
	killRowBytes = 256
	t.Cleanup(func() { killRowBytes = 64 })
	runKill9(t, testseed.Scaled(4, 12, 100))
}

func runKill9(t *testing.T, cycles int) {
	seed := uint64(time.Now().UnixNano())
	if s, ok := testseed.Replay(t); ok {
		seed = s
	}
	t.Logf("%d cycles, seed %d", cycles, seed)
	rng := rand.New(rand.NewPCG(seed, 9))
	dir := t.TempDir()
	lastAck := make([]uint64, killWriters)
	start := time.Now()
	totalAcks, checkpoints := uint64(0), 0
	for c := range cycles {
		mode := SyncAlways
		if c%2 == 1 {
			mode = SyncNone
		}
		small := c%4 == 3
		target := rng.IntN(6000)
		if small {
			target = rng.IntN(600) // checkpoint-bound: about 1000 batches a second
		}
		if rng.IntN(10) == 0 {
			target = -1 // kill while the writer opens (recovers) the store
		}
		var expect []uint64
		if c%2 == 0 && c > 0 {
			// The previous cycle left the killed store unverified: this writer checks it.
			expect = append([]uint64(nil), lastAck...)
		}
		t0 := time.Now()
		n, ckpts := killCycle(t, dir, mode, small, target, expect, lastAck)
		checkpoints += ckpts
		totalAcks += uint64(n)
		if testing.Verbose() {
			t.Logf("cycle %d: sync %s, small cache %v, target %d: %d acks, %d checkpoints, %v",
				c, mode, small, target, n, ckpts, time.Since(t0).Round(time.Millisecond))
		}
		if c%2 == 0 {
			verifyKilledStore(t, dir, mode, lastAck, fmt.Sprintf("cycle %d (target %d acks)", c, target))
		}
	}
	verifyKilledStore(t, dir, SyncAlways, lastAck, "end")
	t.Logf("%d cycles in %v; %d batches acknowledged; at least %d checkpoints seen",
		cycles, time.Since(start).Round(time.Millisecond), totalAcks, checkpoints)
}

// verifyKilledStore opens the killed store in this process, checks the rows and closes it.
func verifyKilledStore(t *testing.T, dir string, mode SyncMode, lastAck []uint64, msg string) {
	requireCheckNoDamage(t, nil, dir, msg+": check")
	e, err := Open(killOptions(dir, mode, os.Getenv(killSmallEnv) != ""))
	require.NoError(t, err, msg)
	defer func() { require.NoError(t, e.Close(), msg) }()
	table, g, err := openKillTable(e)
	require.NoError(t, err, msg)
	require.NoError(t, verifyKillRows(e, table, lastAck, g.LastSeq), msg)
}
