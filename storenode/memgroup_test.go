package storenode

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/storenode/wal"
)

// memGroup is the in-memory replication log of the replica tests (the Proposer's test double,
// docs/replication.md 5): the leader's Proposer appends to its uncommitted tail; the test
// commits the tail's head in order (an entry may be delivered twice, as a resent proposal
// both copies of which commit), applies the committed entries to each engine at its own pace,
// and at a leader change drops the uncommitted tail (the old leader's callers are told by
// ProposalsLost). A new leader applies every committed entry before it takes proposals.
//
// Lock order: an engine's mu, then g.mu (Propose runs under the engine's mu); ApplyCommitted
// and ProposalsLost are called with g.mu released.
type memGroup struct {
	t        testing.TB
	mu       sync.Mutex
	engines  []*Engine
	leader   int           // the engine whose Proposer accepts proposals; -1 during a change
	tail     []memEntry    // proposed, not committed
	log      []memEntry    // committed: log[i] is the entry of index i+1
	applied  []int         // per engine, the entries of log applied
	proposed chan struct{} // signalled by each proposal but an expiry's
}

// memEntry is one proposed record.
type memEntry struct {
	kind    byte
	payload []byte
	id      uint64
}

// memProposer is engine self's Proposer of a memGroup.
type memProposer struct {
	g    *memGroup
	self int
}

func newMemGroup(t testing.TB, n int) *memGroup {
	return &memGroup{t: t, engines: make([]*Engine, n), leader: -1, applied: make([]int, n), proposed: make(chan struct{}, 1)}
}

// Propose appends the record to the tail if self leads (a copy: the pieces are not kept).
func (p *memProposer) Propose(kind byte, pieces []wal.Piece, force bool, id uint64) error {
	g := p.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.leader != p.self {
		return ErrNotLeader
	}
	var payload []byte
	for _, pc := range pieces {
		payload = append(payload, pc.Bytes...)
	}
	g.tail = append(g.tail, memEntry{kind: kind, payload: payload, id: id})
	if kind == kindExpired {
		return nil // proposed by any checkpoint, the background ones too: not a call's signal
	}
	select {
	case g.proposed <- struct{}{}:
	default:
	}
	return nil
}

// Lease reports an unbounded lease while self leads.
func (p *memProposer) Lease() (int64, bool) {
	p.g.mu.Lock()
	defer p.g.mu.Unlock()
	return math.MaxInt64, p.g.leader == p.self
}

// commit commits the first n entries of the tail, each delivered twice when dup says so.
func (g *memGroup) commit(n int, dup func() bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	n = min(n, len(g.tail))
	for _, ent := range g.tail[:n] {
		g.log = append(g.log, ent)
		if dup != nil && dup() {
			g.log = append(g.log, ent)
		}
	}
	g.tail = append(g.tail[:0], g.tail[n:]...)
}

// behind reports how many committed entries engine i has not applied.
func (g *memGroup) behind(i int) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.log) - g.applied[i]
}

// apply applies engine i's next n committed entries.
func (g *memGroup) apply(i, n int) {
	for range n {
		g.mu.Lock()
		if g.applied[i] == len(g.log) {
			g.mu.Unlock()
			return
		}
		index := g.applied[i] + 1
		ent := g.log[index-1]
		g.applied[i] = index
		g.mu.Unlock()
		require.NoError(g.t, g.engines[i].ApplyCommitted(uint64(index), ent.id, ent.kind, ent.payload), "engine %d entry %d", i, index)
	}
}

// drain commits the whole tail and applies every entry everywhere.
func (g *memGroup) drain() {
	g.commit(math.MaxInt, nil)
	for i := range g.engines {
		g.apply(i, math.MaxInt)
	}
}

// changeLeader makes engine to the leader: the uncommitted tail is dropped, the old leader's
// waiting proposals end with ErrNotLeader, the new leader applies the whole log first.
func (g *memGroup) changeLeader(to int) {
	g.mu.Lock()
	old := g.leader
	g.leader = -1
	g.tail = g.tail[:0]
	g.mu.Unlock()
	if old >= 0 {
		g.engines[old].ProposalsLost(ErrNotLeader)
	}
	g.apply(to, math.MaxInt)
	g.mu.Lock()
	g.leader = to
	g.mu.Unlock()
}

// entry returns the committed entry of index.
func (g *memGroup) entry(index uint64) (memEntry, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if index == 0 || index > uint64(len(g.log)) {
		return memEntry{}, false
	}
	return g.log[index-1], true
}

// call runs fn, a call that waits for its proposals' outcome, on a goroutine, committing and
// applying everything proposed until it returns.
func (g *memGroup) call(fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	timeout := time.NewTimer(10 * time.Second) // a bound, not a synchronisation
	defer timeout.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-g.proposed:
			g.drain()
		case <-timeout.C:
			g.t.Fatal("memGroup: a proposed call did not return")
		}
	}
}
