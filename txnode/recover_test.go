package txnode

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode/store"
)

// fenceRig is a DB over one store (embedded or a storage node over TCP) with two
// cluster-managed tables, acct and gold, and a way to fence acct: another owner's newer
// grant registered at the store.
type fenceRig struct {
	t      *testing.T
	g      *memGrants
	remote bool
	dir    string
	addr   string
	db     *DB
	acct   *Table
	gold   *Table
	fencer store.Store // the other owner's store handle
	// wrap, when set, wraps the embedded store the DB opens on.
	wrap func(store.Store) store.Store
}

const rigOwner, rigOther = 0x42, 0x43

func newFenceRig(t *testing.T, remote bool) *fenceRig {
	return newFenceRigWrapped(t, remote, nil)
}

func newFenceRigWrapped(t *testing.T, remote bool, wrap func(store.Store) store.Store) *fenceRig {
	ctx := context.Background()
	r := &fenceRig{t: t, g: &memGrants{keys: map[string][2]uint64{}, owner: rigOwner, rev: 10}, remote: remote, dir: t.TempDir(), wrap: wrap}
	if remote {
		addr, stop := startStorageNodeWith(t, storenode.Options{Dir: r.dir, Sync: storenode.SyncNone, GrantVerifier: r.g})
		t.Cleanup(stop)
		r.addr = addr
	}
	r.open()
	var err error
	lay := base.ClusterLayout{Partitions: 1, StripePages: 1}
	r.acct, err = r.db.createClusterTable(ctx, "acct", 64, lay)
	require.NoError(t, err)
	r.gold, err = r.db.createClusterTable(ctx, "gold", 64, lay)
	require.NoError(t, err)
	if remote {
		r.fencer, err = dialStore(ctx, Options{StoreAddr: r.addr, OwnerID: rigOther}.withDefaults())
		require.NoError(t, err)
		t.Cleanup(func() { r.fencer.Close() })
	} else {
		r.fencer = r.db.store
	}
	return r
}

// open opens the DB (again) on the rig's store.
func (r *fenceRig) open() {
	ctx := context.Background()
	opts := Options{OwnerID: rigOwner, grants: r.g}
	if r.remote {
		opts.StoreAddr = r.addr
	} else {
		st, err := store.OpenEmbedded(storenode.Options{Dir: r.dir, Sync: storenode.SyncNone, GrantVerifier: r.g})
		require.NoError(r.t, err)
		if r.wrap != nil {
			st = r.wrap(st)
		}
		opts.Store = st
	}
	db, err := Open(ctx, opts)
	require.NoError(r.t, err)
	r.db = db
	r.t.Cleanup(func() { db.Close(context.Background()) })
}

// fenceAcct registers another owner's newer grant of acct at the store.
func (r *fenceRig) fenceAcct() {
	r.g.grantOther(r.t, context.Background(), r.fencer, "acct/0", r.acct.t.id, rigOther)
}

func rowVal(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }

// A commit batch the store refuses because one table's grant was fenced fails that table
// only: commits of the other table over the same store go on without reopening the DB
// (on 691c95a every later commit of every table failed with the refused batch's error).
func TestFencedTableDoesNotStopOtherTables(t *testing.T) {
	boolSubtests(t, "embedded", "remote", func(t *testing.T, remote bool) {
		ctx := context.Background()
		r := newFenceRig(t, remote)
		a := insertRow(t, ctx, r.acct, row(1))
		gid := insertRow(t, ctx, r.gold, row(1))

		r.fenceAcct()
		err := r.acct.Put(ctx, a, row(2))
		require.Error(t, err)
		require.True(t, errors.Is(err, storenode.ErrFenced) || errors.Is(err, ErrLeaseExpired), "%v", err)
		_, err = r.acct.Insert(ctx, row(3))
		require.ErrorIs(t, err, ErrLeaseExpired, "acct is latched as fenced")

		for i := uint64(2); i < 20; i++ {
			require.NoError(t, r.gold.Put(ctx, gid, row(i)), "gold after acct was fenced")
			insertRow(t, ctx, r.gold, row(i))
		}
		dst := make([]byte, 64)
		require.NoError(t, r.gold.Get(ctx, gid, dst))
		require.Equal(t, row(19), dst)

		// The two-phase commit's prepare takes the owner's next seq after the recovery
		// (the refused seq, sent again): prepared, decided, applied; commits go on.
		txid := [16]byte{7, 7}
		tx, err := r.db.Begin(ctx, true)
		require.NoError(t, err)
		require.NoError(t, tx.Put(r.gold, gid, row(20)))
		p, err := tx.prepare(txnInfo{ID: txid, Lease: 1})
		require.NoError(t, err)
		require.NoError(t, r.db.decideTxn(ctx, txid, 1, base.DecisionCommit, 1))
		require.NoError(t, p.apply(ctx, base.DecisionCommit))
		require.NoError(t, r.gold.Get(ctx, gid, dst))
		require.Equal(t, row(20), dst)
		require.NoError(t, r.gold.Put(ctx, gid, row(21)))
		require.NoError(t, r.db.Close(ctx))

		r.open()
		gold, err := r.db.Table(ctx, base.PartitionTableName("gold", 0))
		require.NoError(t, err)
		require.NoError(t, gold.Get(ctx, gid, dst))
		require.Equal(t, row(21), dst, "durable at the store")
	})
}

// Concurrent writers on both tables while acct is fenced: A writers write a fresh token to
// their gold row and their acct row in one transaction; B writers copy an A writer's gold
// row into their own (a transaction that reads what A installed); C writers count in their
// gold row. Afterwards: every A transaction acknowledged is durable (its gold row holds its
// last acknowledged token: nothing refused was applied, nothing acknowledged lost), every
// value a B transaction committed is a token some A commit had acknowledged (no transaction
// that read a refused version committed), every C count is exact, and B and C go on
// committing after the fence without a reopen.
func TestFenceUnderConcurrentWriters(t *testing.T) {
	for _, remote := range []bool{false, true} {
		name := "embedded"
		if remote {
			name = "remote"
		}
		t.Run(name, func(t *testing.T) { fenceUnderWriters(t, remote) })
	}
}

func fenceUnderWriters(t *testing.T, remote bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nA, nB, nC, before, after := 4, 4, 4, 200, 200
	if testing.Short() {
		nA, nB, nC, before, after = 2, 2, 2, 30, 30
	}
	r := newFenceRig(t, remote)
	ins := func(tb *Table) uint64 {
		id := insertRow(t, ctx, tb, row(0))
		return id
	}
	xs, ys, zs, cs := make([]uint64, nA), make([]uint64, nA), make([]uint64, nB), make([]uint64, nC)
	for i := range xs {
		xs[i], ys[i] = ins(r.gold), ins(r.acct)
	}
	for i := range zs {
		zs[i] = ins(r.gold)
	}
	for i := range cs {
		cs[i] = ins(r.gold)
	}

	var tokens atomic.Uint64
	tokens.Store(1 << 32)
	var mu sync.Mutex
	ackedTok := map[uint64]bool{0: true}
	lastA := make([]uint64, nA)
	lastB := make([]uint64, nB)
	countC := make([]uint64, nC)
	var commits atomic.Int64
	tick := make(chan struct{}, 1)
	committed := func() {
		commits.Add(1)
		select {
		case tick <- struct{}{}:
		default:
		}
	}
	stop := make(chan struct{})
	aErrs := make([]error, nA)
	var wgA, wg sync.WaitGroup
	for i := range nA {
		wgA.Add(1)
		go func() {
			defer wgA.Done()
			for {
				var tok uint64
				err := r.db.Update(ctx, func(tx *Tx) error {
					tok = tokens.Add(1)
					buf := make([]byte, 64)
					if err := tx.Get(r.gold, xs[i], buf); err != nil {
						return err
					}
					if err := tx.Get(r.acct, ys[i], buf); err != nil {
						return err
					}
					if err := tx.Put(r.gold, xs[i], row(tok)); err != nil {
						return err
					}
					return tx.Put(r.acct, ys[i], row(tok))
				})
				if err != nil {
					aErrs[i] = err
					return
				}
				mu.Lock()
				ackedTok[tok] = true
				lastA[i] = tok
				mu.Unlock()
				committed()
			}
		}()
	}
	// untilStop runs step over and over in a goroutine of wg until stop is closed or step
	// returns false.
	untilStop := func(step func() bool) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if !step() {
					return
				}
			}
		}()
	}
	for j := range nB {
		untilStop(func() bool {
			var v uint64
			err := r.db.Update(ctx, func(tx *Tx) error {
				buf := make([]byte, 64)
				if err := tx.Get(r.gold, xs[j%nA], buf); err != nil {
					return err
				}
				v = rowVal(buf)
				return tx.Put(r.gold, zs[j], row(v))
			})
			if !assertNoErr(t, err, "B writer") {
				return false
			}
			mu.Lock()
			lastB[j] = v
			mu.Unlock()
			committed()
			return true
		})
	}
	for k := range nC {
		untilStop(func() bool {
			err := r.db.Update(ctx, func(tx *Tx) error {
				return tx.Update(r.gold, cs[k], func(b []byte) error {
					copy(b, row(rowVal(b)+1))
					return nil
				})
			})
			if !assertNoErr(t, err, "C writer") {
				return false
			}
			mu.Lock()
			countC[k]++
			mu.Unlock()
			committed()
			return true
		})
	}
	bcDone := make(chan struct{}) // every B and C writer ended (an error: the test fails)
	go func() { wg.Wait(); close(bcDone) }()
	waitCommits := func(n int64, what string) {
		for commits.Load() < n {
			select {
			case <-bcDone:
				t.Fatalf("%s: the writers stopped after %d commits", what, commits.Load())
			case <-ctx.Done():
				t.Fatalf("%s: %d commits only", what, commits.Load())
			case <-tick:
			}
		}
	}
	waitCommits(int64(before), "before the fence")
	r.fenceAcct()
	wgA.Wait() // every A writer ends with acct's fence
	for i, err := range aErrs {
		require.Error(t, err, "A writer %d", i)
		require.True(t, errors.Is(err, storenode.ErrFenced) || errors.Is(err, ErrLeaseExpired), "A writer %d: %v", i, err)
	}
	waitCommits(commits.Load()+int64(after), "after the fence")
	close(stop)
	wg.Wait()
	if t.Failed() {
		return
	}

	mu.Lock()
	for j, v := range lastB {
		require.True(t, ackedTok[v], "B writer %d committed %#x, which no acknowledged A commit wrote", j, v)
	}
	mu.Unlock()
	require.NoError(t, r.db.Close(ctx))
	r.open()
	gold, err := r.db.Table(ctx, base.PartitionTableName("gold", 0))
	require.NoError(t, err)
	dst := make([]byte, 64)
	for i, id := range xs {
		require.NoError(t, gold.Get(ctx, id, dst))
		require.Equal(t, lastA[i], rowVal(dst), "A writer %d's last acknowledged token is durable, nothing later", i)
	}
	for j, id := range zs {
		require.NoError(t, gold.Get(ctx, id, dst))
		require.Equal(t, lastB[j], rowVal(dst), "B writer %d", j)
	}
	for k, id := range cs {
		require.NoError(t, gold.Get(ctx, id, dst))
		require.Equal(t, countC[k], rowVal(dst), "C writer %d's count", k)
	}
}

func assertNoErr(t *testing.T, err error, what string) bool {
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return false
	}
	return true
}

// A commit of a refused batch whose committer reaches its durable wait only after the
// pipeline resumed and a later batch was acknowledged (durableVer past the failed range: a
// Session's Pending waited late, a preempted Tx.Commit) fails with the range's ErrConflict:
// the wait's fast path checks the failed ranges too (fails on 87e4162: commitWait's fast path
// returned nil, the refused commit reported durable).
func TestCommitWaitAfterResumeSeesFailedRange(t *testing.T) {
	ctx := context.Background()
	r := newFenceRig(t, false)
	a := insertRow(t, ctx, r.acct, row(1))
	gid := insertRow(t, ctx, r.gold, row(1))
	r.fenceAcct()

	tx, err := r.db.Begin(ctx, true)
	require.NoError(t, err)
	require.NoError(t, tx.Put(r.acct, a, row(2)))
	require.NoError(t, tx.Put(r.gold, gid, row(2)))
	cw, err := tx.commit() // installed, its batch refused; its wait comes late
	tx.release()
	require.NoError(t, err)

	// The pipeline recovers; a later commit is acknowledged past the refused version.
	require.NoError(t, r.gold.Put(ctx, gid, row(3)))
	require.GreaterOrEqual(t, r.db.durableVer.Load(), cw.ver)
	require.ErrorIs(t, cw.wait(r.db, ctx), ErrConflict, "the refused commit is not durable")
	require.NotNil(t, r.db.verFailed(cw.ver))

	dst := make([]byte, 64)
	require.NoError(t, r.gold.Get(ctx, gid, dst))
	require.Equal(t, row(3), dst)
}

// A two-phase commit's prepare of the other table, sent while a batch of the fenced table is
// in flight (the prepare may hold the next seq when that batch is refused): the prepare is
// either taken (applied after its decision) or refused with a known outcome (not taken, its
// seq given back), never left unknown; the pipeline resumes (no wedge, no seq reused wrongly:
// every later commit is applied and survives a reopen).
func TestPrepareDuringRefusal(t *testing.T) {
	n := 12
	if testing.Short() {
		n = 4
	}
	for _, remote := range []bool{false, true} {
		for i := 0; i < n; i++ {
			prepareDuringRefusal(t, remote, byte(i))
		}
	}
}

func prepareDuringRefusal(t *testing.T, remote bool, i byte) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := newFenceRig(t, remote)
	a := insertRow(t, ctx, r.acct, row(1))
	gid := insertRow(t, ctx, r.gold, row(1))
	r.fenceAcct()

	start := make(chan struct{})
	putErr := make(chan error, 1)
	go func() {
		<-start
		putErr <- r.acct.Put(ctx, a, row(2))
	}()
	tx, err := r.db.Begin(ctx, true)
	require.NoError(t, err)
	require.NoError(t, tx.Put(r.gold, gid, row(5)))
	close(start)
	txid := [16]byte{9, i}
	p, err := tx.prepare(txnInfo{ID: txid, Lease: 1})
	want := row(1)
	switch {
	case err == nil:
		require.NoError(t, r.db.decideTxn(ctx, txid, 1, base.DecisionCommit, 1))
		require.NoError(t, p.apply(ctx, base.DecisionCommit))
		want = row(5)
	default:
		require.Nil(t, p, "a prepare refused for the seq gap of a refused batch is not taken: %v", err)
		require.NotErrorIs(t, err, ErrUnknownOutcome)
	}
	require.Error(t, <-putErr, "acct is fenced")
	dst := make([]byte, 64)
	require.NoError(t, r.gold.Get(ctx, gid, dst))
	require.Equal(t, want, dst)
	require.NoError(t, r.gold.Put(ctx, gid, row(7)), "the pipeline resumed")
	require.NoError(t, r.db.Close(ctx))
	r.open()
	gold, err := r.db.Table(ctx, base.PartitionTableName("gold", 0))
	require.NoError(t, err)
	require.NoError(t, gold.Get(ctx, gid, dst))
	require.Equal(t, row(7), dst)
}

// holdStore holds back the answer of commit batches naming table hold (when armed): the
// storage node has refused such a batch, the pipeline does not know yet.
type holdStore struct {
	store.Store
	hold  atomic.Uint32 // a table id; 0: none
	held  chan func()   // the held answers, delivered by calling them
	inner store.TxnStore
}

// newHoldRig is an embedded fenceRig whose DB opens on outer, a store built on h, which
// wraps the rig's embedded store.
func newHoldRig(t *testing.T, h *holdStore, outer store.Store) *fenceRig {
	return newFenceRigWrapped(t, false, func(st store.Store) store.Store {
		h.Store, h.inner = st, st.(store.TxnStore)
		return outer
	})
}

func (h *holdStore) Commit(b *base.Batch, done func(lsn uint64, err error)) {
	id := h.hold.Load()
	for _, f := range b.Fences {
		if id != 0 && f.Table == id {
			h.Store.Commit(b, func(lsn uint64, err error) {
				h.held <- func() { done(lsn, err) }
			})
			return
		}
	}
	h.Store.Commit(b, done)
}

func (h *holdStore) PrepareTxn(ctx context.Context, p *base.TxnPrepare) (uint64, error) {
	return h.inner.PrepareTxn(ctx, p)
}

func (h *holdStore) DecideTxn(ctx context.Context, id base.TxnID, lease int64, d base.Decision, count int) (base.Decision, error) {
	return h.inner.DecideTxn(ctx, id, lease, d, count)
}

func (h *holdStore) ApplyTxn(ctx context.Context, id base.TxnID, d base.Decision) error {
	return h.inner.ApplyTxn(ctx, id, d)
}

// A prepare holding the next seq while the batch before it is refused, the storage node's
// ErrSeqGap for the prepare reaching the pipeline before the batch's refusal: the prepare is
// not taken (a known outcome, its seq given back), the pipeline recovers and the prepare of
// the same transaction, sent again, is taken (fails on 87e4162: the prepare's outcome was
// reported unknown, a goroutine sending it again until the recovery).
func TestPrepareSeqGapBeforeRefusal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hs := &holdStore{held: make(chan func(), 4)}
	r := newHoldRig(t, hs, hs)
	a := insertRow(t, ctx, r.acct, row(1))
	gid := insertRow(t, ctx, r.gold, row(1))
	r.fenceAcct()
	gapWait := make(chan struct{}, 1)
	r.db.testHookWait = func(what string) {
		if what == "seqgap" {
			gapWait <- struct{}{}
		}
	}
	hs.hold.Store(r.acct.t.id)

	putErr := make(chan error, 1)
	go func() { putErr <- r.acct.Put(ctx, a, row(2)) }()
	release := <-hs.held // refused at the store, the pipeline does not know yet

	tx, err := r.db.Begin(ctx, true)
	require.NoError(t, err)
	require.NoError(t, tx.Put(r.gold, gid, row(5)))
	type prepRes struct {
		p   *prepared
		err error
	}
	prep := make(chan prepRes, 1)
	txid := [16]byte{8, 8}
	go func() {
		p, err := tx.prepare(txnInfo{ID: txid, Lease: 1})
		prep <- prepRes{p, err}
	}()
	var res prepRes
	select {
	case <-gapWait: // the prepare waits for the batch before it
		release()
		res = <-prep
	case res = <-prep:
		release()
	}
	hs.hold.Store(0)
	require.Nil(t, res.p, "not taken: %v", res.err)
	require.ErrorIs(t, res.err, storenode.ErrSeqGap)
	require.NotErrorIs(t, res.err, ErrUnknownOutcome)
	for {
		// The put is run again after the recovery: it then fails on acct's latch.
		select {
		case f := <-hs.held:
			f()
			continue
		case err = <-putErr:
		}
		break
	}
	require.ErrorIs(t, err, ErrLeaseExpired)

	tx, err = r.db.Begin(ctx, true)
	require.NoError(t, err)
	require.NoError(t, tx.Put(r.gold, gid, row(5)))
	p, err := tx.prepare(txnInfo{ID: txid, Lease: 1})
	require.NoError(t, err)
	require.NoError(t, r.db.decideTxn(ctx, txid, 1, base.DecisionCommit, 1))
	require.NoError(t, p.apply(ctx, base.DecisionCommit))
	require.NoError(t, r.gold.Put(ctx, gid, row(7)))
	dst := make([]byte, 64)
	require.NoError(t, r.gold.Get(ctx, gid, dst))
	require.Equal(t, row(7), dst)
}

// nextStore holds back the answers of a refused batch and of the batch after it: the first
// batch naming table hold is refused at the store (a fence) and its answer held; what
// becomes of the next seq is mode's:
//   - nextForget: the store applies it, as a storage node does that forgot the refusal (it
//     keeps refusals in memory only, and bounded: a restart, refusedFresh full). It is sent
//     as the refused seq, which the store expects again.
//   - nextRemember: the store refuses it (ErrSeqGap), as it does when it remembers.
//   - nextLost: it never reaches the store: the connection died (ErrUnknownOutcome, as the
//     remote store answers then).
//
// The test delivers the held answers, in order, by calling them.
type nextStore struct {
	*holdStore
	mode    int
	refused atomic.Uint64 // the refused seq; 0: none yet
	next    atomic.Bool   // the batch after it was taken
}

const (
	nextForget = iota
	nextRemember
	nextLost
)

func (f *nextStore) Commit(b *base.Batch, done func(lsn uint64, err error)) {
	hold := func(lsn uint64, err error) { f.held <- func() { done(lsn, err) } }
	if n := f.refused.Load(); n != 0 && b.Seq == n+1 && f.next.CompareAndSwap(false, true) {
		switch f.mode {
		case nextForget:
			c := *b
			c.Seq = n
			f.Store.Commit(&c, hold)
		case nextRemember:
			f.Store.Commit(b, hold)
		case nextLost:
			hold(0, fmt.Errorf("%w: connection lost", ErrUnknownOutcome))
		}
		return
	}
	if id := f.hold.Load(); id != 0 {
		for _, fe := range b.Fences {
			if fe.Table == id {
				f.refused.Store(b.Seq)
				f.hold.Store(0)
				f.Store.Commit(b, hold)
				return
			}
		}
	}
	f.Store.Commit(b, done)
}

// The committer of a batch in flight after a refused one is answered only when that batch
// comes back, with its own outcome, while its readers are refused at once (the failed
// range): ErrConflict if the store refused it too; success if the store applied it (it
// forgot the refusal: the pipeline then fails for good), or an error wrapping
// ErrUnknownOutcome if the transaction read a row of the refused batch, never ErrConflict;
// ErrUnknownOutcome if the connection died. For a manual Tx.Commit and a Session's Pending
// (and Flush) alike (fails on 258841e: the committer got ErrConflict, "nothing applied", at
// once, for a commit the store then applied).
func TestAckAfterRefusalNotConflict(t *testing.T) {
	for _, c := range []struct {
		name         string
		mode         int
		readsRefused bool
		cancel       bool // the committer's context ends while its batch is out
	}{
		{"forget", nextForget, false, false},
		{"forget-reads-refused-row", nextForget, true, false},
		{"remember", nextRemember, false, false},
		{"lost", nextLost, false, false},
		{"context-ends", nextRemember, false, true},
	} {
		for _, session := range []bool{false, true} {
			name := c.name + "/tx"
			if session {
				name = c.name + "/session"
			}
			t.Run(name, func(t *testing.T) { testAckAfterRefusal(t, c.mode, c.readsRefused, c.cancel, session) })
		}
	}
}

func testAckAfterRefusal(t *testing.T, mode int, readsRefused, cancelCommit, session bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	commitCtx, cancelCommitCtx := context.WithCancel(ctx)
	defer cancelCommitCtx()
	fs := &nextStore{holdStore: &holdStore{held: make(chan func(), 4)}, mode: mode}
	r := newHoldRig(t, fs.holdStore, fs)
	a := insertRow(t, ctx, r.acct, row(1))
	gid := insertRow(t, ctx, r.gold, row(1))
	r.fenceAcct()
	fs.hold.Store(r.acct.t.id)

	putErr := make(chan error, 1)
	go func() { putErr <- r.acct.Put(ctx, a, row(2)) }()
	refusal := <-fs.held // batch N refused at the store; the pipeline does not know yet

	fn := func(tx *Tx) error {
		if readsRefused {
			dst := make([]byte, 64)
			require.NoError(t, tx.Get(r.acct, a, dst))
			require.Equal(t, row(2), dst, "the refused batch's row, installed in the cache")
		}
		return tx.Put(r.gold, gid, row(5))
	}
	commitErr := make(chan error, 1)
	var s *Session
	var pend, ro *Pending
	if session {
		s = r.db.Session()
		pend = s.Go(ctx, fn)
		// A read-only pending after it resolves no earlier (the session's order).
		ro = s.Go(ctx, func(tx *Tx) error { return nil })
		go func() {
			if !cancelCommit {
				<-pend.Done()
			}
			commitErr <- pend.Wait(commitCtx)
		}()
	} else {
		tx, err := r.db.Begin(commitCtx, true)
		require.NoError(t, err)
		require.NoError(t, fn(tx))
		go func() { commitErr <- tx.Commit() }()
	}
	next := <-fs.held // batch N+1's answer, held
	refusal()         // the recovery starts: the failed range covers N+1's version

	dst := make([]byte, 64)
	require.ErrorIs(t, r.gold.Get(ctx, gid, dst), ErrConflict, "a reader of the held version is refused at once")
	var early error // an answer before the batch came back
	select {
	case early = <-commitErr:
	default:
	}
	roEarly := false
	if session {
		select {
		case <-ro.Done():
			roEarly = true
		default:
		}
	}
	var err error // the committer's answer
	if cancelCommit {
		require.NoError(t, early, "the committer of a batch still out was answered")
		cancelCommitCtx() // the wait honours its context: the outcome is unknown then
		select {
		case err = <-commitErr:
		case <-ctx.Done():
			t.Fatal("the committer's wait did not end with its context")
		}
		require.ErrorIs(t, err, ErrUnknownOutcome)
		require.ErrorIs(t, err, context.Canceled)
		require.NotErrorIs(t, err, ErrConflict)
	}
	next()
	require.NoError(t, early, "the committer of a batch still out was answered")
	require.False(t, roEarly, "a read-only pending resolved before the session's write before it")
	if !cancelCommit {
		select {
		case err = <-commitErr:
		case <-ctx.Done():
			t.Fatal("the committer was not answered")
		}
	}
	var flushErr error
	if session {
		flushErr = s.Flush(ctx)
		select {
		case <-ro.Done():
		case <-ctx.Done():
			t.Fatal("the read-only pending was not resolved")
		}
		require.NotErrorIs(t, ro.Wait(ctx), ErrUnknownOutcome, "read-only: nothing to apply")
	}
	require.Error(t, <-putErr)

	want := row(1)
	switch {
	case mode == nextForget:
		require.NotErrorIs(t, err, ErrConflict, "the batch was applied")
		if readsRefused {
			require.ErrorIs(t, err, ErrUnknownOutcome, "applied, on a read of a row never applied")
		} else {
			require.NoError(t, err, "applied, on durable reads")
		}
		if session {
			require.ErrorIs(t, flushErr, ErrUnknownOutcome)
			require.NotErrorIs(t, flushErr, ErrConflict)
		}
		require.ErrorIs(t, r.db.pipe.failure(), ErrUnknownOutcome, "the pipeline fails for good")
		require.ErrorIs(t, r.db.Close(ctx), ErrUnknownOutcome)
		want = row(5)
	case mode == nextRemember:
		if !cancelCommit {
			require.ErrorIs(t, err, ErrConflict, "refused too: nothing applied")
			require.NotErrorIs(t, err, ErrUnknownOutcome)
		}
		if session {
			require.ErrorIs(t, flushErr, ErrConflict)
		}
		require.NoError(t, r.gold.Put(ctx, gid, row(7)), "the pipeline recovered")
		require.NoError(t, r.db.Close(ctx))
		want = row(7)
	case mode == nextLost:
		require.ErrorIs(t, err, ErrUnknownOutcome)
		require.NotErrorIs(t, err, ErrConflict)
		if session {
			require.ErrorIs(t, flushErr, ErrUnknownOutcome)
		}
		require.ErrorIs(t, r.db.pipe.failure(), ErrUnknownOutcome, "the pipeline fails for good")
		require.Error(t, r.db.Close(ctx))
	}

	// The store holds what the acknowledged batch wrote, and only that.
	fs.refused.Store(0)
	r.open()
	gold, err := r.db.Table(ctx, base.PartitionTableName("gold", 0))
	require.NoError(t, err)
	require.NoError(t, gold.Get(ctx, gid, dst))
	require.Equal(t, want, dst)
}
