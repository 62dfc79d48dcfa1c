package storenode

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
)

// The two-phase commit's replay model: two storage nodes, each a primary and a participant,
// take random steps of the protocol in every role (a coordinator's prepare, decide with any
// count 0..64, apply; a resolver's ask, report with any index, pass; a client's made-up ids
// and out-of-range reports; leases dying; the clock passing TxnResolveAfter and TxnAbortKeep;
// checkpoints), and after EVERY step each node is stopped in one of three ways (Close, which
// checkpoints; a kill -9, the WAL since the last checkpoint replayed as written; a power loss,
// unsynced bytes lost), checked by Check (weft verify) and reopened. Replay must accept every
// store, and what the node holds afterwards must be what it held before: every row, every
// prepared part, every decision (what memory alone forgot may come back after a kill: an
// abort, an applied part not yet known reported).
//
// Replays with -rapid.seed (printed on failure); -rapid.checks sets the count.

const txnModelRows = 8

// txnModelNode is one storage node of the model, on its own FaultFS.
type txnModelNode struct {
	name  string
	fs    *vfs.FaultFS
	opts  Options
	e     *Engine
	table uint32
	epoch uint64
	seq   uint64
	// prepared is every id this node ever prepared: an applied part forgotten in memory
	// (reported) may come back after a crash, as applied again.
	prepared map[base.TxnID]bool
	// decided is every decision this node ever recorded as primary, by id.
	decided map[base.TxnID]base.Decision
}

type txnModel struct {
	nodes  [2]*txnModelNode
	leases *memLeases
	peers  *memPeers
	clock  *fakeClock
	ids    []base.TxnID
}

func newTxnModel(t require.TestingT) *txnModel {
	m := &txnModel{leases: &memLeases{}, peers: &memPeers{}, clock: &fakeClock{}}
	m.clock.Now() // copies share one time once it is set
	for i := range 8 {
		m.ids = append(m.ids, base.TxnID{0: 0x5e, 15: byte(i)})
	}
	for i, name := range []string{"a", "b"} {
		n := &txnModelNode{name: name, fs: vfs.NewFaultFS(), prepared: map[base.TxnID]bool{}, decided: map[base.TxnID]base.Decision{}}
		n.opts = Options{Dir: "db", FS: n.fs, Logger: quietLogger, Now: m.clock.Now, LeaseChecker: m.leases, TxnPeer: m.peers,
			TxnResolveInterval: -1, TxnResolveAfter: time.Second, MaxTxns: 6, TxnForgetMax: 4, CheckpointInterval: -1}
		m.nodes[i] = n
		m.open(t, n)
		info, err := n.e.CreateTable("bank", 64)
		require.NoError(t, err)
		n.table = info.ID
		m.acquire(t, n)
		_, err = grantPages(n.e, n.table, testOwner, n.epoch, 1)
		require.NoError(t, err)
		for r := range uint64(txnModelRows) {
			n.seq++
			_, err := n.e.CommitWait(&base.Batch{Owner: testOwner, Seq: n.seq, Fences: []base.Fence{{Table: n.table, Epoch: n.epoch}},
				Segments: []base.Segment{oneRow(n.table, r, row64(1000))}})
			require.NoError(t, err)
		}
	}
	return m
}

func (m *txnModel) open(t require.TestingT, n *txnModelNode) {
	e, err := Open(n.opts)
	require.NoError(t, err, "node %s: open", n.name)
	n.e = e
	m.peers.set(n.name, e)
}

// acquire takes the table again (a restarted holder's new session): a local table's own
// holder is never refused for prepared rows.
func (m *txnModel) acquire(t require.TestingT, n *txnModelNode) {
	g, err := n.e.Acquire(n.table, testOwner, 0)
	require.NoError(t, err)
	n.epoch, n.seq = g.Epoch, g.LastSeq
}

func (m *txnModel) close() {
	for _, n := range m.nodes {
		if n.e != nil {
			n.e.Close()
		}
	}
}

// txnModelPart is what a node keeps of one part, for comparing across a restart.
type txnModelPart struct {
	decision       base.Decision
	primary        string
	index          uint16
	owner, seq     uint64
	segments       string
	lockedSegments int
}

type txnModelDecision struct {
	d        base.Decision
	count    uint16
	reported uint64 // counted bits only
}

type txnModelState struct {
	parts     map[base.TxnID]txnModelPart
	decisions map[base.TxnID]txnModelDecision
	rows      [txnModelRows]uint64
}

// txnModelCounted is the reported bits that count for count participants.
func txnModelCounted(count uint16) uint64 {
	if count >= txnParticipantsMax {
		return ^uint64(0)
	}
	return uint64(1)<<count - 1
}

func (n *txnModelNode) state(t require.TestingT) txnModelState {
	s := txnModelState{parts: map[base.TxnID]txnModelPart{}, decisions: map[base.TxnID]txnModelDecision{}}
	e := n.e
	e.mu.Lock()
	for id, p := range e.txnParts {
		s.parts[id] = txnModelPart{decision: p.decision, primary: p.primary, index: p.index, owner: p.batch.Owner, seq: p.batch.Seq,
			segments: fmt.Sprint(p.batch.Segments), lockedSegments: len(p.batch.Segments)}
	}
	for id, d := range e.txnDecisions {
		s.decisions[id] = txnModelDecision{d: d.d, count: d.count, reported: d.reported & txnModelCounted(d.count)}
	}
	e.mu.Unlock()
	for r := range uint64(txnModelRows) {
		page, slot := logicpage.PageOf(r)
		data, _, out, err := e.ReadRows(n.table, page, 1<<slot, nil)
		require.NoError(t, err)
		require.NotZero(t, data)
		s.rows[r] = uint64FromRow(out)
	}
	return s
}

// restart stops n in one of three ways, checks its directory and reopens it, and requires
// the state it holds to be the one before (see the file doc for what may come back).
func (m *txnModel) restart(t *rapid.T, n *txnModelNode) {
	before := n.state(t)
	how := rapid.SampledFrom([]string{"close", "kill", "powerloss"}).Draw(t, n.name+" restart")
	switch how {
	case "close":
		require.NoError(t, n.e.Close(), "node %s: close", n.name)
	case "kill":
		n.fs.CrashKeepAll()
		n.e.Close()
	case "powerloss":
		n.fs.Crash(nil)
		n.e.Close()
	}
	n.e = nil
	rep, err := Check(context.Background(), "db", CheckOptions{FS: n.fs})
	require.NoError(t, err, "node %s: check after %s", n.name, how)
	require.Empty(t, damages(rep), "node %s: check after %s", n.name, how)
	m.open(t, n)
	m.acquire(t, n)
	require.NoError(t, n.e.verify(), "node %s: verify after %s", n.name, how)
	after := n.state(t)
	require.Equal(t, before.rows, after.rows, "node %s: rows after %s", n.name, how)
	for id, p := range before.parts {
		q, ok := after.parts[id]
		require.True(t, ok, "node %s: part %v lost after %s", n.name, id, how)
		require.Equal(t, p, q, "node %s: part %v after %s", n.name, id, how)
	}
	for id, q := range after.parts {
		if _, ok := before.parts[id]; ok {
			continue
		}
		require.NotEqual(t, "close", how, "node %s: part %v came back after a close", n.name, id)
		require.NotEqual(t, base.DecisionNone, q.decision, "node %s: prepared part %v came back after %s", n.name, id, how)
		require.True(t, n.prepared[id], "node %s: part %v came back after %s, never prepared here", n.name, id, how)
	}
	for id, d := range before.decisions {
		q, ok := after.decisions[id]
		if !ok && d.d == base.DecisionAbort && d.count > 0 && d.reported == txnModelCounted(d.count) {
			continue // an abort every participant reported: forgotten (by replay, or the next sweep)
		}
		require.True(t, ok, "node %s: decision of %v lost after %s", n.name, id, how)
		require.Equal(t, d.d, q.d, "node %s: decision of %v after %s", n.name, id, how)
		if how == "close" || d.d == base.DecisionCommit {
			require.Equal(t, d, q, "node %s: decision of %v after %s", n.name, id, how)
		}
	}
	for id, q := range after.decisions {
		if _, ok := before.decisions[id]; ok {
			continue
		}
		require.NotEqual(t, "close", how, "node %s: decision of %v came back after a close", n.name, id)
		require.Equal(t, base.DecisionAbort, q.d, "node %s: decision of %v came back after %s", n.name, id, how)
		require.Equal(t, base.DecisionAbort, n.decided[id], "node %s: decision of %v came back after %s", n.name, id, how)
	}
}

// txnModelErr fails on the errors no step of the model may cause: a failed engine or damage.
func txnModelErr(t *rapid.T, n *txnModelNode, what string, err error) {
	if err == nil {
		return
	}
	if ferr := n.e.failure(); ferr != nil {
		t.Fatalf("node %s: %s: engine failed: %v (%v)", n.name, what, ferr, err)
	}
	for _, bad := range []error{ErrClosed} {
		if errors.Is(err, bad) {
			t.Fatalf("node %s: %s: %v", n.name, what, err)
		}
	}
}

func (m *txnModel) node(t *rapid.T) *txnModelNode {
	return m.nodes[rapid.IntRange(0, 1).Draw(t, "node")]
}

func (m *txnModel) id(t *rapid.T) base.TxnID { return rapid.SampledFrom(m.ids).Draw(t, "id") }

func (m *txnModel) lease(t *rapid.T) int64 { return int64(rapid.IntRange(1, 3).Draw(t, "lease")) }

func (m *txnModel) noteDecided(n *txnModelNode) {
	n.e.mu.Lock()
	for id, d := range n.e.txnDecisions {
		n.decided[id] = d.d
	}
	n.e.mu.Unlock()
}

func (m *txnModel) actions() map[string]func(*rapid.T) {
	ctx := context.Background()
	return map[string]func(*rapid.T){
		"prepare": func(t *rapid.T) {
			n := m.node(t)
			other := m.nodes[0]
			if other == n {
				other = m.nodes[1]
			}
			primary := rapid.SampledFrom([]string{"", other.name, "gone:1"}).Draw(t, "primary")
			index := uint16(rapid.SampledFrom([]int{0, 1, 2, 5, 63}).Draw(t, "index"))
			row := uint64(rapid.IntRange(0, txnModelRows-1).Draw(t, "row"))
			n.seq++
			id := m.id(t)
			_, err := n.e.PrepareTxn(&base.TxnPrepare{Txn: id, Lease: m.lease(t), Primary: primary, Index: index,
				Batch: &base.Batch{Owner: testOwner, Seq: n.seq, Fences: []base.Fence{{Table: n.table, Epoch: n.epoch}},
					Segments: []base.Segment{oneRow(n.table, row, row64(uint64(rapid.IntRange(1, 999).Draw(t, "value"))))}}})
			if err != nil {
				n.seq-- // a refused prepare takes no seq
			} else {
				n.prepared[id] = true
			}
			txnModelErr(t, n, "prepare", err)
		},
		"commit": func(t *rapid.T) {
			n := m.node(t)
			n.seq++
			row := uint64(rapid.IntRange(0, txnModelRows-1).Draw(t, "row"))
			_, err := n.e.CommitWait(&base.Batch{Owner: testOwner, Seq: n.seq, Fences: []base.Fence{{Table: n.table, Epoch: n.epoch}},
				Segments: []base.Segment{oneRow(n.table, row, row64(uint64(rapid.IntRange(1, 999).Draw(t, "value"))))}})
			if err != nil {
				n.seq--
			}
			txnModelErr(t, n, "commit", err)
		},
		"decide": func(t *rapid.T) {
			n := m.node(t)
			d := rapid.SampledFrom([]base.Decision{base.DecisionCommit, base.DecisionAbort}).Draw(t, "decision")
			count := rapid.SampledFrom([]int{0, 1, 2, 3, 64}).Draw(t, "count")
			_, err := n.e.DecideTxn(ctx, m.id(t), m.lease(t), d, count)
			txnModelErr(t, n, "decide", err)
		},
		"apply": func(t *rapid.T) {
			n := m.node(t)
			d := rapid.SampledFrom([]base.Decision{base.DecisionCommit, base.DecisionAbort}).Draw(t, "decision")
			txnModelErr(t, n, "apply", n.e.ApplyTxn(m.id(t), d))
		},
		"ask": func(t *rapid.T) {
			n := m.node(t)
			_, err := n.e.AskTxn(ctx, m.id(t), m.lease(t))
			txnModelErr(t, n, "ask", err)
		},
		"report": func(t *rapid.T) {
			n := m.node(t)
			index := uint16(rapid.SampledFrom([]int{0, 1, 2, 5, 63}).Draw(t, "index"))
			txnModelErr(t, n, "report", n.e.ReportTxn(m.id(t), index))
		},
		"resolve": func(t *rapid.T) {
			n := m.node(t)
			txnModelErr(t, n, "resolve", n.e.ResolveTxns(ctx))
		},
		"killLease": func(t *rapid.T) {
			m.leases.kill(m.lease(t))
		},
		"advance": func(t *rapid.T) {
			m.clock.Advance(rapid.SampledFrom([]time.Duration{time.Second, DefaultTxnAbortKeep / 2, DefaultTxnAbortKeep}).Draw(t, "advance"))
		},
		"checkpoint": func(t *rapid.T) {
			n := m.node(t)
			txnModelErr(t, n, "checkpoint", n.e.Checkpoint())
		},
		"": func(t *rapid.T) { // after every step: every node restarted
			for _, n := range m.nodes {
				m.noteDecided(n)
				m.restart(t, n)
			}
		},
	}
}

// TestTxnReplayModel runs the replay model (see the file doc).
func TestTxnReplayModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := newTxnModel(t)
		defer m.close()
		t.Repeat(m.actions())
	})
}
