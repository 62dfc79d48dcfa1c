package storenode

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"path"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
)

// replicaTxnStore is one replica (a group of one) on a FaultFS with a local table t (owner 7
// holds it, 64 ids granted) and a cluster table c, for the transaction state sidecar's tests.
type replicaTxnStore struct {
	t     *testing.T
	g     *memGroup
	fs    *vfs.FaultFS
	opts  Options
	e     *Engine
	local base.TableInfo
	clust base.TableInfo
}

func newReplicaTxnStore(t *testing.T) *replicaTxnStore {
	r := &replicaTxnStore{t: t, g: newMemGroup(t, 1), fs: vfs.NewFaultFS()}
	r.opts = Options{Dir: "db", FS: r.fs, Logger: quietLogger, CheckpointInterval: -1, TxnResolveInterval: -1,
		OwnerExpiry: time.Hour, Proposer: &memProposer{g: r.g, self: 0}}
	r.e = openEngine(t, r.opts)
	r.g.engines[0] = r.e
	r.g.changeLeader(0)
	require.NoError(t, r.g.call(func() (err error) { r.local, err = r.e.CreateTable("t", 16); return err }))
	require.NoError(t, r.g.call(func() error { _, err := r.e.Acquire(r.local.ID, 7, 0); return err }))
	require.NoError(t, r.g.call(func() error { _, _, err := r.e.AllocIDs(r.local.ID, 7, 1, 1); return err }))
	require.NoError(t, r.g.call(func() (err error) {
		r.clust, err = r.e.CreateClusterTable(base.PartitionTableName("c", 0), 16, base.ClusterLayout{Partitions: 1, StripePages: 1})
		return err
	}))
	return r
}

// inject applies a record at the next index as replay would (the two-phase commit kinds are
// not proposed yet: this makes the state a replica will hold once they are). It returns the
// index.
func (r *replicaTxnStore) inject(kind byte, payload []byte) uint64 {
	e := r.e
	e.mu.Lock()
	defer e.mu.Unlock()
	index := e.lastLSN + 1
	require.NoError(r.t, e.applyRecord(kind, payload, index), "inject kind %d", kind)
	e.lastLSN = index
	e.durableLSN = index
	e.durableAt.Store(index)
	return index
}

// prepare injects a prepare of owner 7 at seq writing row slot of page 0 of t.
func (r *replicaTxnStore) prepare(id base.TxnID, seq uint64, slot int, primary string, index uint16) {
	b := &base.Batch{Owner: 7, Seq: seq, Fences: []base.Fence{{Table: r.local.ID, Epoch: 1}},
		Segments: []base.Segment{{Table: r.local.ID, RowBytes: 16, Page: 0, Data: 1 << slot, Rows: slices.Repeat([]byte{byte(seq)}, 16)}}}
	rec := appendTxnPrepareHeader(nil, id, 42, index, primary)
	rec = appendCommitRecord(rec, b, txnBatchHash(b, id), func(uint32) int { return 16 })
	r.inject(kindTxnPrepare, rec)
}

func (r *replicaTxnStore) reopen() {
	require.NoError(r.t, r.e.Close())
	r.e = openEngine(r.t, r.opts)
	r.g.engines[0] = r.e
}

// populate makes every kind of state a sidecar holds: prepared parts (one this node's as
// primary, one of another primary), a part applied (commit) and one dropped (abort), not yet
// reported, decisions kept (commit, abort), a forgotten decision and a frozen move.
func (r *replicaTxnStore) populate() {
	r.prepare(txnID(1), 1, 0, "", 0)
	r.prepare(txnID(2), 2, 1, "primary:1", 3)
	r.prepare(txnID(3), 3, 2, "primary:2", 1)
	r.prepare(txnID(4), 4, 3, "primary:2", 2)
	r.inject(kindTxnApply, appendTxnApplyRecord(nil, txnID(3), base.DecisionCommit, 1, "primary:2"))
	r.inject(kindTxnApply, appendTxnApplyRecord(nil, txnID(4), base.DecisionAbort, 2, "primary:2"))
	r.inject(kindTxnDecide, appendTxnDecideRecord(nil, txnID(1), base.DecisionCommit, 2, 42, 1))
	r.inject(kindTxnDecide, appendTxnDecideRecord(nil, txnID(5), base.DecisionAbort, 0, 43, 0))
	r.inject(kindTxnDecide, appendTxnDecideRecord(nil, txnID(6), base.DecisionCommit, 1, 44, 1)) // all reported: forgotten
	r.inject(kindMoveState, appendMoveStateRecord(nil, r.clust.ID, MoveFrozen, 9))
}

// appliedPart matches what an applied part keeps of its prepare in memory only: its lease and
// hash (a standalone checkpoint's carried apply record has neither either).
var appliedPart = regexp.MustCompile(`^(part \S+: decision (commit|abort) .*) lease -?\d+ hash [0-9a-f]+ (.*)$`)

// decisionOwner matches a kept decision's owner (counted for the owner's bound on decisions,
// MaxTxnsPerOwner): known only while the primary's part is prepared when the decision is
// recorded, so a checkpoint taken after the part applied, standalone or not, loses it.
var decisionOwner = regexp.MustCompile(`^(decision .*) owner \d+$`)

// sidecarState is captureReplayState's lines without what no checkpoint keeps (an applied
// part's lease and hash, a decision's owner and the owners' counts of them).
func sidecarState(lines []string) []string {
	out := make([]string, 0, len(lines))
	for _, l := range lines {
		if ownerDecisions.MatchString(l) {
			continue
		}
		l = appliedPart.ReplaceAllString(l, "$1 $3")
		out = append(out, decisionOwner.ReplaceAllString(l, "$1"))
	}
	return out
}

var ownerDecisions = regexp.MustCompile(`^owner \d+ decisions \d+$`)

func (r *replicaTxnStore) sidecars() []string {
	names, err := r.fs.List("db")
	require.NoError(r.t, err)
	var out []string
	for _, n := range names {
		if _, ok := parseTxnStateName(n); ok {
			out = append(out, n)
		}
	}
	return out
}

// TestTxnStateReopen: a replica's checkpoint with prepared, applied and decided parts, a
// forgotten decision and a move writes meta version 6 and txnstate-<index>; the state reopens
// equal (after a clean close and after a crash that loses everything unsynced), Check finds
// no damage, and the next checkpoint's sidecar replaces the old one.
func TestTxnStateReopen(t *testing.T) {
	r := newReplicaTxnStore(t)
	r.populate()
	require.NoError(t, r.e.Checkpoint())
	live := sidecarState(captureReplayState(t, r.e)) // after it: the page maps are in the meta
	r.e.mu.Lock()
	index := r.e.ckptLSN
	r.e.mu.Unlock()
	m, ok, err := loadMeta(r.fs, "db")
	require.NoError(t, err)
	require.True(t, ok)
	require.EqualValues(t, metaVersionReplica, m.version)
	require.Equal(t, index, m.txnState)
	require.Equal(t, []string{txnStateName(index)}, r.sidecars())

	r.fs.Crash(rand.New(rand.NewPCG(1, 2))) // what was not synced is lost
	r.e.Close()
	r.e = openEngine(t, r.opts)
	r.g.engines[0] = r.e
	requireSameLines(t, live, sidecarState(captureReplayState(t, r.e)), "after a crash")
	r.reopen()
	requireSameLines(t, live, sidecarState(captureReplayState(t, r.e)), "after a clean close")
	require.NoError(t, r.e.Close())
	requireCheckNoDamage(t, r.fs, "db", "a replica's checkpoint")
	r.e = openEngine(t, r.opts)
	r.g.engines[0] = r.e

	// The prepared rows stay locked, the applied commit's rows are in.
	r.e.mu.Lock()
	require.ErrorIs(t, r.e.checkTxnLocks([]base.Segment{{Table: r.local.ID, Page: 0, Data: 1}}), ErrTxnLocked)
	r.e.mu.Unlock()
	require.True(t, r.e.TxnStatus(txnID(1)).Prepared)
	require.Equal(t, base.DecisionCommit, r.e.TxnStatus(txnID(1)).Primary)
	require.Equal(t, base.DecisionCommit, r.e.TxnStatus(txnID(3)).Applied)
	st, _, err := r.e.MoveStatus(r.clust.ID)
	require.NoError(t, err)
	require.Equal(t, MoveFrozen, st)

	// A later checkpoint names a new sidecar and removes the old one.
	r.inject(kindTxnForgot, appendTxnForgotRecord(nil, []base.TxnID{txnID(3)}))
	require.NoError(t, r.e.Checkpoint())
	r.e.mu.Lock()
	next := r.e.ckptLSN
	r.e.mu.Unlock()
	require.Greater(t, next, index)
	require.Equal(t, []string{txnStateName(next)}, r.sidecars())
	r.reopen()
	require.Equal(t, base.DecisionNone, r.e.TxnStatus(txnID(3)).Applied, "the forgotten part came back")
	require.NoError(t, r.e.Close())
}

// TestTxnStateEmptyStillNamed: a replica's checkpoint without any transaction writes an empty
// sidecar all the same (the meta file names one from the first checkpoint), and a sidecar
// left by a checkpoint that did not publish is removed at Open.
func TestTxnStateEmptyStillNamed(t *testing.T) {
	r := newReplicaTxnStore(t)
	require.NoError(t, r.e.Checkpoint())
	m, _, err := loadMeta(r.fs, "db")
	require.NoError(t, err)
	require.EqualValues(t, metaVersionReplica, m.version)
	require.NoError(t, r.e.Close())
	stale := path.Join("db", txnStateName(m.txnState+5))
	require.NoError(t, r.fs.WriteFile(stale, []byte("left by a checkpoint that did not publish")))
	rep, err := Check(context.Background(), "db", CheckOptions{FS: r.fs})
	require.NoError(t, err)
	require.False(t, rep.Damaged(), "%v", rep.Findings)
	require.Contains(t, findingFiles(rep), txnStateName(m.txnState+5), "the stale sidecar is noted")
	r.e = openEngine(t, r.opts)
	require.Equal(t, []string{txnStateName(m.txnState)}, r.sidecars())
	require.NoError(t, r.e.Close())
}

func findingFiles(rep *CheckReport) []string {
	var out []string
	for _, f := range rep.Findings {
		out = append(out, f.File)
	}
	return out
}

// TestTxnStateDamageRefused: a sidecar that is missing, torn (cut short), damaged (a byte
// flipped) or of another index is refused at Open with a corruption error naming it, never
// taken for an empty state; Check reports it as damage.
func TestTxnStateDamageRefused(t *testing.T) {
	r := newReplicaTxnStore(t)
	r.populate()
	require.NoError(t, r.e.Checkpoint())
	require.NoError(t, r.e.Close())
	m, _, err := loadMeta(r.fs, "db")
	require.NoError(t, err)
	name := path.Join("db", txnStateName(m.txnState))
	good, err := r.fs.ReadFile(name)
	require.NoError(t, err)
	other := slices.Clone(good)
	other[16]++ // another index, checksum fixed below

	for _, tc := range []struct {
		name string
		data []byte // nil: removed
		want string
	}{
		{"missing", nil, "is missing"},
		{"torn", good[:len(good)/2], "checksum"},
		{"empty", []byte{}, "torn or truncated"},
		{"flipped", func() []byte { b := slices.Clone(good); b[40] ^= 0x10; return b }(), "checksum"},
		{"other index", resealTxnState(other), "holds the state of index"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.data == nil {
				require.NoError(t, r.fs.Remove(name))
			} else {
				require.NoError(t, r.fs.WriteFile(name, tc.data))
			}
			_, err := Open(r.opts)
			require.ErrorIs(t, err, corrupt.ErrCorruption)
			require.ErrorContains(t, err, txnStateName(m.txnState))
			require.ErrorContains(t, err, tc.want)
			rep, err := Check(context.Background(), "db", CheckOptions{FS: r.fs})
			require.NoError(t, err)
			require.True(t, rep.Damaged(), "Check found no damage")
			require.Contains(t, findingFiles(rep), txnStateName(m.txnState))
			require.NoError(t, r.fs.WriteFile(name, good))
		})
	}
	standalone := r.opts
	standalone.Proposer = nil
	_, err = Open(standalone)
	require.ErrorContains(t, err, "open it with Options.Proposer", "a replica's store opened standalone")
	r.e = openEngine(t, r.opts) // intact again
	require.True(t, r.e.TxnStatus(txnID(1)).Prepared)
	require.NoError(t, r.e.Close())
}

// resealTxnState recomputes a sidecar's checksum after a test changed its bytes.
func resealTxnState(b []byte) []byte {
	out := slices.Clone(b)
	body := out[:len(out)-txnStateTrailerBytes]
	binary.LittleEndian.PutUint32(out[len(body):], checksum.Of(body))
	return out
}

// TestStandaloneCheckpointWritesNoTxnState: a standalone store's checkpoint with prepared
// parts carries them in the WAL as before: meta version 4, no sidecar.
func TestStandaloneCheckpointWritesNoTxnState(t *testing.T) {
	s, opts, fs := txnFaultStore(t, Options{})
	s.requirePrepared(t, txnID(1), 1, "primary:1", 0, 1, 5)
	require.NoError(t, s.e.Checkpoint())
	m, _, err := loadMeta(fs, opts.Dir)
	require.NoError(t, err)
	require.EqualValues(t, metaVersion, m.version)
	require.Zero(t, m.txnState)
	names, err := fs.List(opts.Dir)
	require.NoError(t, err)
	for _, n := range names {
		_, ok := parseTxnStateName(n)
		require.False(t, ok, "a standalone store wrote %s", n)
	}
}

// TestMetaReplicaRoundTrip: a version-6 meta file (with and without cluster tables)
// re-encodes to its bytes; its index must be the checkpoint LSN.
func TestMetaReplicaRoundTrip(t *testing.T) {
	for _, seed := range metaSeeds() {
		m, err := decodeMeta(seed)
		require.NoError(t, err)
		if m.version != metaVersion && m.version != metaVersionCluster {
			continue
		}
		m.txnState = m.ckptLSN
		if m.ckptLSN == 0 {
			continue
		}
		b := encodeMeta(m)
		m2, err := decodeMeta(b)
		require.NoError(t, err)
		require.EqualValues(t, metaVersionReplica, m2.version)
		require.Equal(t, m.ckptLSN, m2.txnState)
		require.Equal(t, b, encodeMeta(m2))
		m.txnState = m.ckptLSN + 1
		_, err = decodeMeta(encodeMeta(m))
		require.ErrorIs(t, err, corrupt.ErrCorruption)
	}
}

// txnStateCrashRun builds a replica with a checkpoint of the populated state (before), changes
// it (a part forgotten, one prepared, the move ended), and checkpoints again; crashAt, when
// non-negative, lets that second checkpoint run crashAt mutating IO operations only. It
// returns the store, the state before, and the operations the second checkpoint attempted.
func txnStateCrashRun(t *testing.T, crashAt int64) (*replicaTxnStore, []string, int64) {
	r := newReplicaTxnStore(t)
	r.populate()
	require.NoError(t, r.e.Checkpoint())
	before := sidecarState(captureReplayState(t, r.e))
	r.inject(kindTxnForgot, appendTxnForgotRecord(nil, []base.TxnID{txnID(3)}))
	r.prepare(txnID(9), 5, 4, "", 0)
	r.inject(kindMoveState, appendMoveStateRecord(nil, r.clust.ID, MoveLive, 0))
	if crashAt >= 0 {
		r.fs.SetCrashPoint(crashAt)
	}
	ops0 := r.fs.Ops()
	err := r.e.Checkpoint()
	if crashAt < 0 {
		require.NoError(t, err)
	}
	return r, before, r.fs.Ops() - ops0
}

// TestTxnStateCrashPoints: a replica's checkpoint crashed at every mutating IO operation (then
// power cut, unsynced writes lost) reopens, never refused for its sidecar, to the state of the
// checkpoint before or of the one that crashed, and keeps only the sidecar its meta names.
func TestTxnStateCrashPoints(t *testing.T) {
	full, before, total := txnStateCrashRun(t, -1)
	after := sidecarState(captureReplayState(t, full.e))
	require.NotEqual(t, before, after)
	require.NoError(t, full.e.Close())
	t.Logf("a replica's checkpoint: %d mutating IO operations", total)
	require.Greater(t, total, int64(4))
	sawBefore, sawAfter := false, false
	for k := int64(0); k <= total; k++ {
		r, before, _ := txnStateCrashRun(t, k)
		r.e.Close()
		r.fs.Crash(rand.New(rand.NewPCG(uint64(k), 3)))
		e, err := Open(r.opts)
		require.NoError(t, err, "crash point %d of %d", k, total)
		got := sidecarState(captureReplayState(t, e))
		if slices.Equal(got, before) {
			sawBefore = true
		} else {
			requireSameLines(t, after, got, fmt.Sprintf("crash point %d of %d: neither the old checkpoint's state nor the new", k, total))
			sawAfter = true
		}
		m, _, err := loadMeta(r.fs, "db")
		require.NoError(t, err)
		require.Equal(t, []string{txnStateName(m.txnState)}, r.sidecars(), "crash point %d", k)
		require.NoError(t, e.Close())
	}
	require.True(t, sawBefore && sawAfter, "the crash points reached both states")
}

// TestTxnStateLargeStreamed: a sidecar over 1 MiB (a large prepared batch) reads back whole,
// and one damaged near its end is refused by the streamed check before it is read into memory.
func TestTxnStateLargeStreamed(t *testing.T) {
	id := base.TxnID{1, 0xbb}
	b := &base.Batch{Owner: 7, Seq: 1, Fences: []base.Fence{{Table: 1, Epoch: 1}}}
	for page := range uint64(40) {
		b.Segments = append(b.Segments, base.Segment{Table: 1, RowBytes: 512, Page: page, Data: ^uint64(0), Rows: bytes.Repeat([]byte{byte(page)}, 64*512)})
	}
	rec := appendTxnPrepareHeader(nil, id, 42, 0, "")
	rec = appendCommitRecord(rec, b, txnBatchHash(b, id), func(uint32) int { return 512 })
	ents := []txnStateEntry{{kind: kindTxnPrepare, lsn: 3, payload: rec}}
	data := encodeTxnStateBytes(9, ents)
	require.Greater(t, len(data), txnStateStreamBytes)
	fs := vfs.NewFaultFS()
	require.NoError(t, fs.MkdirAll("db"))
	name := path.Join("db", txnStateName(9))
	require.NoError(t, fs.WriteFile(name, data))
	got, err := readTxnState(fs, "db", 9)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, rec, got[0].payload)
	data[len(data)-100] ^= 1
	require.NoError(t, fs.WriteFile(name, data))
	_, err = readTxnState(fs, "db", 9)
	require.ErrorIs(t, err, corrupt.ErrCorruption)
	require.ErrorContains(t, err, "torn or damaged")
}
