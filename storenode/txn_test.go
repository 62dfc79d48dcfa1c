package storenode

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/sgio"
)

// memLeases is the in-memory LeaseChecker of the tests: leases are alive until killed.
type memLeases struct {
	mu   sync.Mutex
	dead map[int64]bool
	err  error
}

func (l *memLeases) LeaseAlive(ctx context.Context, lease int64) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return false, l.err
	}
	return !l.dead[lease], nil
}

func (l *memLeases) kill(lease int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead == nil {
		l.dead = make(map[int64]bool)
	}
	l.dead[lease] = true
}

// memPeers is the in-memory TxnPeer of the tests: primaries by name, engines in this process.
type memPeers struct {
	mu  sync.Mutex
	eng map[string]*Engine
}

func (p *memPeers) set(name string, e *Engine) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.eng == nil {
		p.eng = make(map[string]*Engine)
	}
	p.eng[name] = e
}

func (p *memPeers) get(name string) (*Engine, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.eng[name]; e != nil {
		return e, nil
	}
	return nil, fmt.Errorf("no storage node %q", name)
}

func (p *memPeers) AskTxn(ctx context.Context, primary string, id base.TxnID, lease int64) (base.Decision, error) {
	e, err := p.get(primary)
	if err != nil {
		return base.DecisionNone, err
	}
	return e.AskTxn(ctx, id, lease)
}

func (p *memPeers) ReportTxn(ctx context.Context, primary string, id base.TxnID, index uint16) error {
	e, err := p.get(primary)
	if err != nil {
		return err
	}
	return e.ReportTxn(id, index)
}

// txnStore is one engine with a table of 64-byte rows held by testOwner, for the txn tests.
type txnStore struct {
	e     *Engine
	table uint32
	epoch uint64
	seq   uint64
	owner uint64 // testOwner when 0
}

func newTxnStore(t testing.TB, opts Options) *txnStore {
	t.Helper()
	if opts.TxnResolveInterval == 0 {
		opts.TxnResolveInterval = -1 // the tests run the resolver by hand
	}
	e := openTest(t, opts)
	return setupTxnStore(t, e)
}

func setupTxnStore(t testing.TB, e *Engine) *txnStore {
	t.Helper()
	info, err := e.OpenTable("bank")
	if errors.Is(err, ErrTableNotFound) {
		info, err = e.CreateTable("bank", 64)
	}
	require.NoError(t, err)
	g := acquire(t, e, info.ID, testOwner, 0)
	requireGranted(t, e, info.ID, testOwner, g.Epoch)
	return &txnStore{e: e, table: info.ID, epoch: g.Epoch, seq: g.LastSeq}
}

func (s *txnStore) batch(segs ...base.Segment) *base.Batch {
	s.seq++
	owner := s.owner
	if owner == 0 {
		owner = testOwner
	}
	return &base.Batch{Owner: owner, Seq: s.seq, Fences: []base.Fence{{Table: s.table, Epoch: s.epoch}}, Segments: segs}
}

func (s *txnStore) put(t testing.TB, id, v uint64) {
	t.Helper()
	_, err := s.e.CommitWait(s.batch(oneRow(s.table, id, row64(v))))
	require.NoError(t, err)
}

func (s *txnStore) get(t testing.TB, id uint64) uint64 {
	t.Helper()
	row, ok := readRow(t, s.e, s.table, id)
	require.True(t, ok, "row %d", id)
	return uint64FromRow(row)
}

func uint64FromRow(row []byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(row[i])
	}
	return v
}

func (s *txnStore) prepare(t testing.TB, id base.TxnID, lease int64, primary string, index uint16, row, v uint64) (uint64, error) {
	t.Helper()
	return s.e.PrepareTxn(&base.TxnPrepare{Txn: id, Lease: lease, Primary: primary, Index: index, Batch: s.batch(oneRow(s.table, row, row64(v)))})
}

// requirePrepared is prepare that fails the test on error.
func (s *txnStore) requirePrepared(t testing.TB, id base.TxnID, lease int64, primary string, index uint16, row, v uint64) uint64 {
	t.Helper()
	lsn, err := s.prepare(t, id, lease, primary, index, row, v)
	require.NoError(t, err)
	return lsn
}

func txnID(n byte) base.TxnID { return base.TxnID{0: 0x7e, 15: n} }

// TestTxnPrepareApply: prepared rows are invisible and locked until the decision is applied;
// commit writes them, abort drops them; applying again is a no-op, the other decision fails.
func TestTxnPrepareApply(t *testing.T) {
	s := newTxnStore(t, Options{})
	s.put(t, 1, 100)
	s.put(t, 2, 200)

	s.requirePrepared(t, txnID(1), 9, "", 0, 1, 150)
	require.Equal(t, uint64(100), s.get(t, 1), "a prepared row reads as its committed version")
	_, err := s.e.CommitWait(s.batch(oneRow(s.table, 1, row64(1))))
	require.ErrorIs(t, err, ErrTxnLocked, "a commit touching a prepared row")
	require.ErrorIs(t, err, sgio.ErrTxnLocked, "the wire's sentinel matches too")
	s.seq-- // the refused batch did not take its seq
	_, err = s.prepare(t, txnID(2), 9, "", 0, 1, 1)
	require.ErrorIs(t, err, ErrTxnLocked, "a prepare touching a prepared row")
	s.seq--
	_, err = s.e.CommitWait(s.batch(oneRow(s.table, 3, row64(3)))) // another row of the page
	require.NoError(t, err)
	require.ErrorIs(t, s.e.DropTable("bank", testOwner), ErrTxnLocked)

	require.NoError(t, s.e.ApplyTxn(txnID(1), base.DecisionCommit))
	require.Equal(t, uint64(150), s.get(t, 1))
	require.NoError(t, s.e.ApplyTxn(txnID(1), base.DecisionCommit), "idempotent")
	require.ErrorIs(t, s.e.ApplyTxn(txnID(1), base.DecisionAbort), ErrTxnDecided)
	s.put(t, 1, 151) // unlocked

	s.requirePrepared(t, txnID(3), 9, "", 0, 2, 250)
	require.NoError(t, s.e.ApplyTxn(txnID(3), base.DecisionAbort))
	require.Equal(t, uint64(200), s.get(t, 2))
	s.put(t, 2, 201)
	require.NoError(t, s.e.ApplyTxn(txnID(99), base.DecisionCommit), "an unknown transaction")

	// A retried prepare (same seq, same bytes) is acknowledged with its LSN; another
	// transaction under that seq is refused.
	b := s.batch(oneRow(s.table, 4, row64(4)))
	p := &base.TxnPrepare{Txn: txnID(4), Lease: 9, Batch: b}
	lsn, err := s.e.PrepareTxn(p)
	require.NoError(t, err)
	again, err := s.e.PrepareTxn(p)
	require.NoError(t, err)
	require.Equal(t, lsn, again)
	_, err = s.e.PrepareTxn(&base.TxnPrepare{Txn: txnID(5), Lease: 9, Batch: b})
	require.ErrorIs(t, err, ErrSeqReused)
	_, err = s.e.CommitWait(b)
	require.ErrorIs(t, err, ErrSeqReused, "a commit under a prepare's seq is not taken for it")
}

// TestTxnFencedPrepare: a prepare is fenced as a commit is, before the seq window.
func TestTxnFencedPrepare(t *testing.T) {
	s := newTxnStore(t, Options{})
	s.epoch++
	_, err := s.prepare(t, txnID(1), 9, "", 0, 1, 1)
	require.ErrorIs(t, err, ErrFenced)
	parts, _ := s.e.TxnCounts()
	require.Zero(t, parts)
}

// TestTxnDecideCAS: the first decision is kept; a different one fails naming it; a commit
// after the coordinator's lease is gone records abort; a resolver's abort makes a late
// commit fail.
func TestTxnDecideCAS(t *testing.T) {
	leases := &memLeases{}
	s := newTxnStore(t, Options{LeaseChecker: leases})
	ctx := context.Background()
	for i, lease := range []int64{5, 6, 7, 8} {
		s.primaryPart(t, txnID(byte(i+1)), lease)
	}

	d, err := s.e.DecideTxn(ctx, txnID(1), 5, base.DecisionCommit, 2)
	require.NoError(t, err)
	require.Equal(t, base.DecisionCommit, d)
	d, err = s.e.DecideTxn(ctx, txnID(1), 5, base.DecisionCommit, 2)
	require.NoError(t, err, "the same decision again")
	require.Equal(t, base.DecisionCommit, d)
	requireAbortNamesCommit(ctx, t, s.e, txnID(1), 5)

	// Undecided, lease alive: the resolver hears "none".
	got, err := s.e.AskTxn(ctx, txnID(2), 6)
	require.NoError(t, err)
	require.Equal(t, base.DecisionNone, got)
	leases.kill(6)
	got, err = s.e.AskTxn(ctx, txnID(2), 6)
	require.NoError(t, err)
	require.Equal(t, base.DecisionAbort, got)
	_, err = s.e.DecideTxn(ctx, txnID(2), 6, base.DecisionCommit, 2)
	require.ErrorIs(t, err, ErrTxnDecided, "a late commit after a resolver's abort")
	require.Contains(t, err.Error(), "abort recorded")

	// A commit whose lease is gone records abort itself.
	leases.kill(7)
	d, err = s.e.DecideTxn(ctx, txnID(3), 7, base.DecisionCommit, 1)
	require.ErrorIs(t, err, ErrTxnDecided)
	require.Equal(t, base.DecisionAbort, d)
	require.Equal(t, base.DecisionAbort, s.e.TxnStatus(txnID(3)).Primary)

	// A lease check that fails decides nothing.
	leases.mu.Lock()
	leases.err = errors.New("etcd unreachable")
	leases.mu.Unlock()
	_, err = s.e.DecideTxn(ctx, txnID(4), 8, base.DecisionCommit, 1)
	require.Error(t, err)
	require.Equal(t, base.DecisionNone, s.e.TxnStatus(txnID(4)).Primary)
	_, err = s.e.AskTxn(ctx, txnID(4), 8)
	require.Error(t, err)
	require.Equal(t, base.DecisionNone, s.e.TxnStatus(txnID(4)).Primary)

	_, err = s.e.DecideTxn(ctx, txnID(5), 8, base.DecisionCommit, 0)
	require.ErrorIs(t, err, ErrMalformed)
	_, err = s.e.DecideTxn(ctx, txnID(5), 8, base.DecisionNone, 1)
	require.ErrorIs(t, err, ErrMalformed)
}

// TestTxnForget: a commit is kept until every participant reported; an abort until every
// one did or TxnAbortKeep passed.
func TestTxnForget(t *testing.T) {
	clock := fakeClock{}
	s := newTxnStore(t, Options{Now: clock.Now, TxnAbortKeep: time.Minute})
	ctx := context.Background()
	s.primaryPart(t, txnID(1), 5)
	s.primaryPart(t, txnID(2), 5)
	_, err := s.e.DecideTxn(ctx, txnID(1), 5, base.DecisionCommit, 3)
	require.NoError(t, err)
	for _, i := range []uint16{2, 0, 2} {
		require.NoError(t, s.e.ReportTxn(txnID(1), i))
		require.Equal(t, base.DecisionCommit, s.e.TxnStatus(txnID(1)).Primary)
	}
	require.ErrorIs(t, s.e.ReportTxn(txnID(1), 3), ErrMalformed, "participant beyond the count")
	require.NoError(t, s.e.ReportTxn(txnID(1), 1))
	require.Equal(t, base.DecisionNone, s.e.TxnStatus(txnID(1)).Primary, "forgotten")
	require.NoError(t, s.e.ReportTxn(txnID(1), 1), "a report of a forgotten transaction")

	_, err = s.e.DecideTxn(ctx, txnID(2), 5, base.DecisionAbort, 2)
	require.NoError(t, err)
	require.NoError(t, s.e.ReportTxn(txnID(2), 0))
	require.NoError(t, s.e.ResolveTxns(ctx))
	require.Equal(t, base.DecisionAbort, s.e.TxnStatus(txnID(2)).Primary, "kept: one participant has not reported")
	clock.Advance(time.Minute)
	require.NoError(t, s.e.ResolveTxns(ctx))
	require.Equal(t, base.DecisionNone, s.e.TxnStatus(txnID(2)).Primary, "forgotten after the keep time")
	_, decisions := s.e.TxnCounts()
	require.Zero(t, decisions)
}

// TestTxnBusy: the prepared transactions are bounded.
func TestTxnBusy(t *testing.T) {
	s := newTxnStore(t, Options{MaxTxns: 2})
	for i := range 2 {
		s.requirePrepared(t, txnID(byte(i)), 1, "", 0, uint64(i), 1)
	}
	_, err := s.prepare(t, txnID(9), 1, "", 0, 9, 1)
	require.ErrorIs(t, err, ErrTxnBusy)
}

// TestTxnRestart: prepared parts, applied parts not yet reported and decisions survive
// restarts and any number of checkpoints in between (carried past each checkpoint LSN).
func TestTxnRestart(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Dir: dir, TxnResolveInterval: -1}
	e := openEngine(t, opts)
	s := setupTxnStore(t, e)
	s.put(t, 1, 100)
	s.requirePrepared(t, txnID(1), 5, "", 0, 1, 150)
	s.requirePrepared(t, txnID(2), 5, "peer:1", 1, 2, 250)
	_, err := e.DecideTxn(context.Background(), txnID(1), 5, base.DecisionCommit, 2)
	require.NoError(t, err)
	for range 3 {
		require.NoError(t, e.Checkpoint())
	}
	require.NoError(t, e.Close())

	rep := requireChecked(t, context.Background(), dir, CheckOptions{})
	require.False(t, rep.Damaged(), "%+v", rep.Findings)

	for round := range 3 {
		e = openEngine(t, opts)
		s = setupTxnStore(t, e)
		require.Equal(t, TxnStatus{Prepared: true, Primary: base.DecisionCommit}, e.TxnStatus(txnID(1)), "round %d", round)
		require.Equal(t, TxnStatus{Prepared: true}, e.TxnStatus(txnID(2)))
		require.Equal(t, uint64(100), s.get(t, 1))
		_, err = e.CommitWait(s.batch(oneRow(s.table, 2, row64(1))))
		require.ErrorIs(t, err, ErrTxnLocked, "still locked after a restart")
		require.NoError(t, e.Checkpoint())
		require.NoError(t, e.Close())
	}

	e = openEngine(t, opts)
	s = setupTxnStore(t, e)
	require.NoError(t, e.ApplyTxn(txnID(1), base.DecisionCommit))
	require.NoError(t, e.Checkpoint())
	require.NoError(t, e.Close())
	e = openEngine(t, opts)
	defer e.Close()
	s = setupTxnStore(t, e)
	require.Equal(t, uint64(150), s.get(t, 1))
	require.Equal(t, TxnStatus{Applied: base.DecisionCommit, Primary: base.DecisionCommit}, e.TxnStatus(txnID(1)), "applied, to report")
	// The resolver reports to itself (this node is the primary): half the participants.
	require.NoError(t, e.ResolveTxns(context.Background()), "txn 2 is too young to ask its primary")
	require.Equal(t, TxnStatus{Primary: base.DecisionCommit}, e.TxnStatus(txnID(1)))
	require.NoError(t, e.ReportTxn(txnID(1), 1))
	require.Equal(t, TxnStatus{}, e.TxnStatus(txnID(1)), "every participant reported: forgotten")
}

// TestTxnResolve: two engines, a coordinator that prepared on both and died. Undecided, the
// participants wait while its lease lives and resolve to abort once it is gone; decided
// commit at the primary, the participant it never told resolves to commit.
func TestTxnResolve(t *testing.T) {
	leases := &memLeases{}
	peers := &memPeers{}
	clock := fakeClock{}
	opts := Options{LeaseChecker: leases, TxnPeer: peers, Now: clock.Now, TxnResolveAfter: time.Second}
	a, b := newTxnStore(t, opts), newTxnStore(t, opts)
	peers.set("a", a.e)
	peers.set("b", b.e)
	ctx := context.Background()
	a.put(t, 1, 100)
	b.put(t, 1, 100)

	// Coordinator 1 (lease 11): prepares a -10 at a (primary, participant 0) and +10 at b.
	a.requirePrepared(t, txnID(1), 11, "", 0, 1, 90)
	b.requirePrepared(t, txnID(1), 11, "a", 1, 1, 110)
	require.NoError(t, b.e.ResolveTxns(ctx))
	require.True(t, b.e.TxnStatus(txnID(1)).Prepared, "too young to resolve")
	clock.Advance(time.Second)
	require.NoError(t, b.e.ResolveTxns(ctx))
	require.True(t, b.e.TxnStatus(txnID(1)).Prepared, "the coordinator's lease lives: wait")
	leases.kill(11)
	require.NoError(t, b.e.ResolveTxns(ctx))
	require.Equal(t, TxnStatus{}, b.e.TxnStatus(txnID(1)), "resolved to abort, reported")
	require.Equal(t, uint64(100), b.get(t, 1))
	require.NoError(t, a.e.ResolveTxns(ctx))
	require.Equal(t, uint64(100), a.get(t, 1))
	_, err := a.e.DecideTxn(ctx, txnID(1), 11, base.DecisionCommit, 2)
	require.ErrorIs(t, err, ErrTxnDecided, "the coordinator wakes up and commits: too late")

	// Coordinator 2 (lease 12) decides commit at a, applies at a, dies before telling b.
	a.requirePrepared(t, txnID(2), 12, "", 0, 1, 80)
	b.requirePrepared(t, txnID(2), 12, "a", 1, 1, 120)
	_, err = a.e.DecideTxn(ctx, txnID(2), 12, base.DecisionCommit, 2)
	require.NoError(t, err)
	require.NoError(t, a.e.ApplyTxn(txnID(2), base.DecisionCommit))
	require.NoError(t, a.e.ResolveTxns(ctx)) // a reports to itself
	require.Equal(t, base.DecisionCommit, a.e.TxnStatus(txnID(2)).Primary, "kept until b reports")
	clock.Advance(time.Second)
	require.NoError(t, b.e.ResolveTxns(ctx), "lease 12 is alive, but commit is recorded")
	require.Equal(t, uint64(120), b.get(t, 1))
	require.Equal(t, uint64(80), a.get(t, 1))
	for _, s := range []*txnStore{a, b} {
		parts, decisions := s.e.TxnCounts()
		require.Zero(t, parts)
		require.Zero(t, decisions)
	}
	sa, sb := a.e.Stats(), b.e.Stats()
	require.Equal(t, uint64(1), sa.TxnResolverAborts, "a recorded txn 1's abort for b's resolver")
	require.Equal(t, uint64(2), sb.TxnResolved, "b resolved both by asking a")
	require.Equal(t, uint64(1), sb.TxnCommits)
	require.Equal(t, uint64(1), sb.TxnAborts)
}

// TestTxnBytesBounded: the bytes of prepared batches held are bounded, and given back when
// a decision is applied.
func TestTxnBytesBounded(t *testing.T) {
	s := newTxnStore(t, Options{MaxTxnBytes: 300})
	s.requirePrepared(t, txnID(1), 1, "", 0, 1, 1)
	_, err := s.prepare(t, txnID(2), 1, "", 0, 2, 1)
	require.ErrorIs(t, err, ErrTxnBusy)
	s.seq--
	require.NoError(t, s.e.ApplyTxn(txnID(1), base.DecisionAbort))
	s.requirePrepared(t, txnID(2), 1, "", 0, 2, 1)
}

// countingPeer counts the reports a resolver sends.
type countingPeer struct {
	memPeers
	reports int
}

func (p *countingPeer) ReportTxn(ctx context.Context, primary string, id base.TxnID, index uint16) error {
	p.mu.Lock()
	p.reports++
	p.mu.Unlock()
	return p.memPeers.ReportTxn(ctx, primary, id, index)
}

// TestTxnReportOnlyDurable: a participant reports its applied decision only once the apply
// record is synced: a report before could let the primary forget a commit that a crash
// would make the participant ask about again (and be answered abort). The window is made
// by hand: the part's apply LSN is put past the durable LSN.
func TestTxnReportOnlyDurable(t *testing.T) {
	peers := &countingPeer{}
	a := newTxnStore(t, Options{})
	b := newTxnStore(t, Options{TxnPeer: peers})
	peers.set("a", a.e)
	ctx := context.Background()
	commitOnTwo(ctx, t, a, b)

	b.e.mu.Lock()
	p := b.e.txnParts[txnID(1)]
	lsn := p.lsn
	p.lsn = b.e.durableThrough() + 1
	b.e.mu.Unlock()
	require.NoError(t, b.e.ResolveTxns(ctx))
	require.Zero(t, peers.reports, "reported before the apply record was durable")

	b.e.mu.Lock()
	p.lsn = lsn
	b.e.mu.Unlock()
	require.NoError(t, b.e.ResolveTxns(ctx))
	require.Equal(t, 1, peers.reports)
	require.Equal(t, TxnStatus{}, b.e.TxnStatus(txnID(1)))
}

// TestTxnGrantWaitsForResolution: a table with rows of a transaction in doubt is not granted
// to another owner (it would cache rows the decision may still change) until resolved.
func TestTxnGrantWaitsForResolution(t *testing.T) {
	clock := fakeClock{}
	s := newTxnStore(t, Options{Now: clock.Now})
	s.requirePrepared(t, txnID(1), 3, "", 0, 1, 5)
	clock.Advance(DefaultLeaseDuration + time.Second)
	_, err := s.e.Acquire(s.table, testOwner+1, 0)
	require.ErrorIs(t, err, ErrTxnLocked)
	require.NoError(t, s.e.ApplyTxn(txnID(1), base.DecisionAbort))
	_, err = s.e.Acquire(s.table, testOwner+1, 0)
	require.NoError(t, err)
}

// signalPeer tells a channel each time a report was delivered.
type signalPeer struct {
	memPeers
	reported chan base.TxnID
}

func (p *signalPeer) ReportTxn(ctx context.Context, primary string, id base.TxnID, index uint16) error {
	err := p.memPeers.ReportTxn(ctx, primary, id, index)
	if err == nil {
		p.reported <- id
	}
	return err
}

// TestTxnBackgroundResolver: the engine's own resolver loop reports an applied decision as
// soon as it is applied (kicked, not waiting for its period), and stops with Close.
func TestTxnBackgroundResolver(t *testing.T) {
	peers := &signalPeer{reported: make(chan base.TxnID, 4)}
	a := newTxnStore(t, Options{})
	b := newTxnStore(t, Options{TxnPeer: peers, TxnResolveInterval: time.Hour})
	peers.set("a", a.e)
	ctx := context.Background()
	commitOnTwo(ctx, t, a, b)
	select {
	case id := <-peers.reported:
		require.Equal(t, txnID(1), id)
	case <-time.After(20 * time.Second):
		t.Fatal("the resolver did not report the applied decision")
	}
	require.NoError(t, b.e.Close()) // waits for the resolver's pass to end
	require.Equal(t, TxnStatus{}, b.e.TxnStatus(txnID(1)), "forgotten once reported")
	require.NoError(t, a.e.ApplyTxn(txnID(1), base.DecisionCommit)) // the primary's own part
	require.NoError(t, a.e.ResolveTxns(ctx))                        // reports it to itself
	require.Equal(t, TxnStatus{}, a.e.TxnStatus(txnID(1)), "both reported")
}

// TestTxnReplayOverCacheKeepsPrepared: a replay whose pages do not fit the cache, with a
// transaction in doubt, must not checkpoint (its checkpoint LSN would pass the prepare
// record, which replay cannot carry): the prepared transaction survives a second crash right
// after such a recovery. The store crashes as kill -9 does (FaultFS.CrashKeepAll).
func TestTxnReplayOverCacheKeepsPrepared(t *testing.T) {
	fs := vfs.NewFaultFS()
	opts := Options{Dir: "db", FS: fs, CacheBytes: 4 << 20, CheckpointInterval: -1, CheckpointWALBytes: -1,
		TxnResolveInterval: -1, Logger: quietLogger}
	e := openEngine(t, opts)
	s := setupTxnStore(t, e)
	const pages = 200
	_, err := grantPages(e, s.table, testOwner, s.epoch, pages)
	require.NoError(t, err)
	s.requirePrepared(t, txnID(1), 5, "", 0, 1, 111)
	for p := uint64(1); p < pages; p++ {
		s.put(t, p*64, p)
	}
	fs.CrashKeepAll()
	_ = e.Close()

	small := opts
	small.CacheBytes = MinCacheBytes
	for round := range 2 {
		e, err = Open(small) // replays 200 dirty pages through a cache of a few
		require.NoError(t, err, "round %d", round)
		require.Equal(t, TxnStatus{Prepared: true}, e.TxnStatus(txnID(1)), "round %d", round)
		fs.CrashKeepAll() // before any checkpoint of the running engine
		_ = e.Close()
	}
	e = openEngine(t, small)
	defer e.Close()
	s = setupTxnStore(t, e)
	require.NoError(t, e.ApplyTxn(txnID(1), base.DecisionCommit))
	require.Equal(t, uint64(111), s.get(t, 1))
	for p := uint64(1); p < pages; p++ {
		require.Equal(t, p, s.get(t, p*64))
	}
}

// TestTxnResolverLazy: an engine runs its resolver only once it keeps a transaction (or
// recovers one): the single-node paths run no extra goroutine.
func TestTxnResolverLazy(t *testing.T) {
	dir := t.TempDir()
	e := openEngine(t, Options{Dir: dir})
	s := setupTxnStore(t, e)
	s.put(t, 1, 1)
	running := func(e *Engine) bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.resolveCtx != nil
	}
	require.False(t, running(e), "no transaction: no resolver")
	s.requirePrepared(t, txnID(1), 1, "", 0, 2, 2)
	require.True(t, running(e))
	require.NoError(t, e.Close())
	e = openEngine(t, Options{Dir: dir})
	defer e.Close()
	require.True(t, running(e), "recovered a transaction in doubt")
}

// TestTxnPrepareTooLarge: a batch too large to be applied in one reservation is refused at
// prepare, not stuck in doubt.
func TestTxnPrepareTooLarge(t *testing.T) {
	s := newTxnStore(t, Options{})
	segs := make([]base.Segment, txnSegmentsMax+1)
	for i := range segs {
		segs[i] = deleteRow(s.table, 0)
	}
	_, err := s.e.PrepareTxn(&base.TxnPrepare{Txn: txnID(1), Batch: s.batch(segs...)})
	require.ErrorIs(t, err, ErrBatchTooLarge)
}

// TestTxnForgottenDecisionResent: the coordinator's answer to Decide(commit) is lost, every
// participant resolves (commit), applies and reports, so the primary forgets the commit; the
// coordinator's resend of the same Decide is answered commit from the memory of forgotten
// decisions: with the lease gone no abort is recorded (a committed transaction reported
// aborted), with it alive no second record is kept (a leak nobody reports). Fails on
// e30d5f7: abort recorded, and a second commit kept.
func TestTxnForgottenDecisionResent(t *testing.T) {
	clock := fakeClock{}
	leases := &memLeases{}
	s := newTxnStore(t, Options{Now: clock.Now, LeaseChecker: leases, TxnAbortKeep: time.Minute, TxnForgetMax: 4})
	ctx := context.Background()

	commitForgotten := func(id base.TxnID, lease int64) {
		t.Helper()
		s.primaryPart(t, id, lease)
		d, err := s.e.DecideTxn(ctx, id, lease, base.DecisionCommit, 2)
		require.NoError(t, err)
		require.Equal(t, base.DecisionCommit, d)
		require.NoError(t, s.e.ReportTxn(id, 0))
		require.NoError(t, s.e.ReportTxn(id, 1))
		require.Equal(t, base.DecisionNone, s.e.TxnStatus(id).Primary, "forgotten")
	}

	// The lease alive: the resend is answered commit, nothing new kept.
	commitForgotten(txnID(1), 5)
	d, err := s.e.DecideTxn(ctx, txnID(1), 5, base.DecisionCommit, 2)
	require.NoError(t, err)
	require.Equal(t, base.DecisionCommit, d)
	_, decisions := s.e.TxnCounts()
	require.Zero(t, decisions, "no second commit record")

	// The lease gone: still commit, no abort recorded.
	commitForgotten(txnID(2), 6)
	leases.kill(6)
	d, err = s.e.DecideTxn(ctx, txnID(2), 6, base.DecisionCommit, 2)
	require.NoError(t, err)
	require.Equal(t, base.DecisionCommit, d)
	require.Equal(t, base.DecisionNone, s.e.TxnStatus(txnID(2)).Primary)
	// An abort of it names the commit; an Ask hears commit; nothing recorded either way.
	requireAbortNamesCommit(ctx, t, s.e, txnID(2), 6)
	got, err := s.e.AskTxn(ctx, txnID(2), 6)
	require.NoError(t, err)
	require.Equal(t, base.DecisionCommit, got)
	_, decisions = s.e.TxnCounts()
	require.Zero(t, decisions)

	// A forgotten abort: its resend and a late commit are answered abort, nothing recorded.
	s.primaryPart(t, txnID(3), 7)
	leases.kill(7)
	d, err = s.e.DecideTxn(ctx, txnID(3), 7, base.DecisionAbort, 2)
	require.NoError(t, err)
	require.Equal(t, base.DecisionAbort, d)
	require.NoError(t, s.e.ReportTxn(txnID(3), 0))
	require.NoError(t, s.e.ReportTxn(txnID(3), 1))
	require.NoError(t, s.e.ResolveTxns(ctx)) // the sweep forgets it
	require.Equal(t, base.DecisionNone, s.e.TxnStatus(txnID(3)).Primary)
	d, err = s.e.DecideTxn(ctx, txnID(3), 7, base.DecisionAbort, 2)
	require.NoError(t, err)
	require.Equal(t, base.DecisionAbort, d)
	d, err = s.e.DecideTxn(ctx, txnID(3), 7, base.DecisionCommit, 2)
	require.ErrorIs(t, err, ErrTxnDecided)
	require.Equal(t, base.DecisionAbort, d)
	_, decisions = s.e.TxnCounts()
	require.Zero(t, decisions, "no new abort record")
	require.NoError(t, s.e.verify())

	// Bounded by count: TxnForgetMax (4) remembered, the oldest give way.
	for i := range 4 {
		commitForgotten(txnID(byte(10+i)), 8)
	}
	s.e.mu.Lock()
	require.Len(t, s.e.txnForgot, 4)
	_, old := s.e.txnForgot[txnID(1)]
	s.e.mu.Unlock()
	require.False(t, old, "the oldest gave way")

	// Bounded by time: after TxnAbortKeep the memory is gone, and the resend is a new
	// Decide again (the coordinator's rule: past this window it trusts no abort).
	clock.Advance(time.Minute)
	leases.kill(8)
	d, err = s.e.DecideTxn(ctx, txnID(13), 8, base.DecisionCommit, 2)
	require.ErrorIs(t, err, ErrTxnDecided)
	require.Equal(t, base.DecisionAbort, d)
	s.e.mu.Lock()
	require.LessOrEqual(t, len(s.e.txnForgotQ), 4)
	s.e.mu.Unlock()
	require.NoError(t, s.e.verify())
}

// TestTxnForgottenDecisionRestart: a primary that restarts still answers a resent Decide of
// a commit it forgot, from the records its checkpoints carry (Close checkpoints too), across
// restarts; a forgotten abort is carried too, and neither is kept as a live decision after
// the replay. Fails without the carry: abort recorded.
func TestTxnForgottenDecisionRestart(t *testing.T) {
	for _, ckpt := range []bool{false, true} {
		leases := &memLeases{}
		opts := Options{Dir: t.TempDir(), TxnResolveInterval: -1, LeaseChecker: leases}
		e := openEngine(t, opts)
		ctx := context.Background()
		s := setupTxnStore(t, e)
		s.primaryPart(t, txnID(1), 5)
		s.primaryPart(t, txnID(2), 5)
		_, err := e.DecideTxn(ctx, txnID(1), 5, base.DecisionCommit, 2)
		require.NoError(t, err)
		require.NoError(t, e.ReportTxn(txnID(1), 0))
		require.NoError(t, e.ReportTxn(txnID(1), 1))
		_, err = e.DecideTxn(ctx, txnID(2), 5, base.DecisionAbort, 1)
		require.NoError(t, err)
		require.NoError(t, e.ReportTxn(txnID(2), 0))
		require.NoError(t, e.ResolveTxns(ctx)) // sweeps the abort
		_, decisions := e.TxnCounts()
		require.Zero(t, decisions)
		if ckpt {
			require.NoError(t, e.Checkpoint())
			require.NoError(t, e.Checkpoint())
		}
		require.NoError(t, e.Close())
		leases.kill(5)

		for round := range 2 {
			e = openEngine(t, opts)
			_, decisions = e.TxnCounts()
			require.Zero(t, decisions, "checkpoint %v round %d: nothing live after the replay", ckpt, round)
			d, err := e.DecideTxn(ctx, txnID(1), 5, base.DecisionCommit, 2)
			require.NoError(t, err, "checkpoint %v round %d", ckpt, round)
			require.Equal(t, base.DecisionCommit, d)
			d, err = e.DecideTxn(ctx, txnID(2), 5, base.DecisionAbort, 1)
			require.NoError(t, err)
			require.Equal(t, base.DecisionAbort, d)
			_, decisions = e.TxnCounts()
			require.Zero(t, decisions, "no new record")
			require.NoError(t, e.verify())
			require.NoError(t, e.Checkpoint())
			require.NoError(t, e.Close())
		}
		rep := requireChecked(t, ctx, opts.Dir, CheckOptions{})
		require.False(t, rep.Damaged(), "%+v", rep.Findings)
	}
}

// TestTxnPrepareAfterForgottenAbort: a prepare reaching the primary after it recorded abort
// and forgot it (every participant reported) is refused, as one before the forgetting is.
func TestTxnPrepareAfterForgottenAbort(t *testing.T) {
	s := newTxnStore(t, Options{TxnResolveInterval: -1})
	ctx := context.Background()
	_, err := s.e.DecideTxn(ctx, txnID(1), 5, base.DecisionAbort, 1)
	require.NoError(t, err)
	require.NoError(t, s.e.ReportTxn(txnID(1), 0))
	require.NoError(t, s.e.ResolveTxns(ctx))
	_, decisions := s.e.TxnCounts()
	require.Zero(t, decisions, "forgotten")
	_, err = s.prepare(t, txnID(1), 5, "", 0, 1, 150)
	require.ErrorIs(t, err, ErrTxnDecided)
	parts, _ := s.e.TxnCounts()
	require.Zero(t, parts)
}

// TestTxnForgottenDecisionGivenWay: a forgotten commit that gave way to newer ones before
// TxnAbortKeep (past TxnForgetMax, or past the MaxTxns a checkpoint carries across a
// restart) must not be answered "abort recorded" when its coordinator resends Decide(commit)
// with the lease gone: the coordinator trusts such an abort within decideTrust, and would
// report a committed transaction aborted. The primary answers ErrTxnBusy (no decision
// recorded) until TxnAbortKeep passed since a young one gave way. Fails on dc71a4c: abort
// recorded, both after the count eviction and after the restart.
func TestTxnForgottenDecisionGivenWay(t *testing.T) {
	ctx := context.Background()
	commitForgotten := func(e *Engine, id base.TxnID, lease int64) {
		t.Helper()
		setupTxnStore(t, e).primaryPart(t, id, lease)
		_, err := e.DecideTxn(ctx, id, lease, base.DecisionCommit, 1)
		require.NoError(t, err)
		require.NoError(t, e.ApplyTxn(id, base.DecisionCommit))
		require.NoError(t, e.ResolveTxns(ctx)) // reports the part to itself, then forgets it
		require.Equal(t, TxnStatus{}, e.TxnStatus(id))
	}
	t.Run("count", func(t *testing.T) {
		clock := fakeClock{}
		leases := &memLeases{}
		s := newTxnStore(t, Options{Now: clock.Now, LeaseChecker: leases, TxnAbortKeep: time.Minute, TxnForgetMax: 2})
		commitForgotten(s.e, txnID(1), 5)
		commitForgotten(s.e, txnID(2), 6)
		commitForgotten(s.e, txnID(3), 6) // txnID(1) gives way
		leases.kill(5)
		d, err := s.e.DecideTxn(ctx, txnID(1), 5, base.DecisionCommit, 1)
		require.ErrorIs(t, err, ErrTxnBusy, "a committed transaction answered %v", d)
		require.NotErrorIs(t, err, ErrTxnDecided)
		_, decisions := s.e.TxnCounts()
		require.Zero(t, decisions, "no abort recorded")
		// Past TxnAbortKeep the coordinator trusts no abort anyway: refused then, its part
		// gone (ErrTxnNotPrepared matches ErrTxnDecided), nothing recorded.
		clock.Advance(time.Minute)
		_, err = s.e.DecideTxn(ctx, txnID(1), 5, base.DecisionCommit, 1)
		require.ErrorIs(t, err, ErrTxnNotPrepared)
		require.ErrorIs(t, err, ErrTxnDecided)
		_, decisions = s.e.TxnCounts()
		require.Zero(t, decisions)
		require.NoError(t, s.e.verify())
	})
	t.Run("restart", func(t *testing.T) {
		leases := &memLeases{}
		opts := Options{Dir: t.TempDir(), TxnResolveInterval: -1, LeaseChecker: leases, MaxTxns: 2}
		e := openEngine(t, opts)
		commitForgotten(e, txnID(1), 5)
		commitForgotten(e, txnID(2), 6)
		commitForgotten(e, txnID(3), 6)
		require.NoError(t, e.Close()) // carries the newest 2
		leases.kill(5)
		e = openEngine(t, opts)
		defer func() { require.NoError(t, e.Close()) }()
		d, err := e.DecideTxn(ctx, txnID(3), 6, base.DecisionCommit, 1)
		require.NoError(t, err, "carried")
		require.Equal(t, base.DecisionCommit, d)
		d, err = e.DecideTxn(ctx, txnID(1), 5, base.DecisionCommit, 1)
		require.ErrorIs(t, err, ErrTxnBusy, "a committed transaction answered %v", d)
		require.NotErrorIs(t, err, ErrTxnDecided)
		_, decisions := e.TxnCounts()
		require.Zero(t, decisions, "no abort recorded")
	})
}

// TestTxnHolderReadOfPreparedRowsRefused: the holder may not read (and so cache) rows a
// prepared transaction holds: a cache that lost its locks (a new transaction node of the same
// owner and grant, after a storage node restart) would write the committed version back over
// the commit applied later. Found by TestBankCoordinatorAndStorageNodeKilled (an acknowledged
// transfer's credit lost). Other readers get the committed version; after the decision the
// holder reads the applied rows. Fails on e126be4: the holder read the old version.
func TestTxnHolderReadOfPreparedRowsRefused(t *testing.T) {
	s := newTxnStore(t, Options{})
	s.put(t, 1, 100)
	s.put(t, 3, 300)
	s.requirePrepared(t, txnID(1), 9, "", 0, 1, 150)

	_, _, _, err := s.e.ReadRowsAs(testOwner, s.table, 0, 1<<1, nil)
	require.ErrorIs(t, err, ErrTxnLocked, "the holder's read of a prepared row")
	require.ErrorIs(t, err, sgio.ErrTxnLocked)
	data, _, rows, err := s.e.ReadRowsAs(testOwner, s.table, 0, 1<<3, nil)
	require.NoError(t, err, "another row of the page")
	require.Equal(t, uint64(1<<3), data)
	require.Equal(t, uint64(300), uint64FromRow(rows))
	data, _, rows, err = s.e.ReadRowsAs(testOwner+1, s.table, 0, 1<<1, nil)
	require.NoError(t, err, "a reader that is not the holder")
	require.Equal(t, uint64(1<<1), data)
	require.Equal(t, uint64(100), uint64FromRow(rows), "the committed version")

	require.NoError(t, s.e.ApplyTxn(txnID(1), base.DecisionCommit))
	_, _, rows, err = s.e.ReadRowsAs(testOwner, s.table, 0, 1<<1, nil)
	require.NoError(t, err)
	require.Equal(t, uint64(150), uint64FromRow(rows), "the applied commit")
}

// requireAbortNamesCommit: an abort of transaction id (lease lease, 2 parts), whose commit is
// decided, is refused with ErrTxnDecided naming the commit, and answered commit.
func requireAbortNamesCommit(ctx context.Context, t *testing.T, e *Engine, id base.TxnID, lease int64) {
	t.Helper()
	d, err := e.DecideTxn(ctx, id, lease, base.DecisionAbort, 2)
	require.ErrorIs(t, err, ErrTxnDecided)
	require.Contains(t, err.Error(), "commit recorded")
	require.Equal(t, base.DecisionCommit, d)
}

// commitOnTwo commits transaction txnID(1) (lease 3) of primary a's part and b's part (row 1
// at version 5, index 1): a decides commit, b applies it.
func commitOnTwo(ctx context.Context, t *testing.T, a, b *txnStore) {
	t.Helper()
	a.primaryPart(t, txnID(1), 3)
	b.requirePrepared(t, txnID(1), 3, "a", 1, 1, 5)
	_, err := a.e.DecideTxn(ctx, txnID(1), 3, base.DecisionCommit, 2)
	require.NoError(t, err)
	require.NoError(t, b.e.ApplyTxn(txnID(1), base.DecisionCommit))
}
