package storenode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/bitmaptree"
	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/storenode/wal"
)

// Limits of the engine.
const (
	// tablePagesMax bounds a table's logical pages, so (table, page) packs into one uint64 and
	// row ids stay below 2^36: logicpage.TablePagesMax, the one definition of the limit.
	tablePagesMax = logicpage.TablePagesMax
	// MaxRowID is one past the largest row id a table can hold (logicpage.TableRowsMax).
	MaxRowID = logicpage.TableRowsMax
	// idPagesPerGrantMax bounds one AllocIDs call.
	idPagesPerGrantMax = 1 << 16
)

// Engine is an open store: the durable copy of a set of tables. Its methods may be called from
// any goroutine. Calls that wait for durability (Commit's done callback, CreateTable,
// AllocIDs, Acquire) never hold the engine's lock while they wait.
type Engine struct {
	opts  Options
	fs    vfs.FS
	dir   string
	lock  io.Closer
	log   *wal.WAL
	start time.Time

	ckptMu    sync.Mutex  // one checkpoint at a time
	mlog      mapLogState // the published map log; under ckptMu (Open before)
	ckptChunk ckptChunks  // bounds of a checkpoint's lock holds (tests lower them)
	logSlack  int64       // mapLogSlack (tests lower it to compact the map log often)

	// mu guards everything below it, the page cache and every table's mutable fields, except
	// what leaseMu guards.
	mu        sync.Mutex
	cond      *sync.Cond // frames loaded, seqs advanced, checkpoints finished, failure
	tables    map[uint32]*table
	byName    map[string]*table
	dropped   []*table // dropped, data file not yet removed
	nextTable uint32
	owners    map[uint64]*ownerState // the owners table (dedup.go)
	cache     *pageCache
	lastLSN   uint64 // last LSN handed to the WAL
	ckptLSN   uint64 // last published checkpoint LSN
	ckptGen   uint64 // bumped when a checkpoint ends
	// recoveredSynced is the synced LSN of the meta file Open loaded: every record up to it
	// had been durable, which a checkpoint inside replay must keep proving.
	recoveredSynced uint64
	// walBytesAtCkpt is stats.walBytes when the last checkpoint started.
	walBytesAtCkpt uint64
	trig           cacheTrigger // when dirty pages start a checkpoint (checkpoint.go)
	closed         bool
	replaying      bool
	scratch        []byte      // WAL payload under construction
	pieces         []wal.Piece // a commit record's payload for the WAL (commitPieces)
	onePiece       [1]wal.Piece

	// repl is a replica's pending overlay and waiting proposals (proposer.go); under mu.
	repl replState

	// moves holds the tables a partition move concerns (move.go); nil while none. Under mu.
	moves map[uint32]*tableMove

	// Two-phase commit (txn.go), under mu.
	txnParts     map[base.TxnID]*txnPart
	txnDecisions map[base.TxnID]*txnDecision
	// txnAborted holds, by engine clock time, the aborts applied here to a transaction not
	// prepared here (yet): a prepare of it arriving later is refused. Memory only, at most
	// Options.MaxTxns, each kept Options.TxnAbortKeep. Guarded by mu.
	txnAborted map[base.TxnID]time.Time
	// txnAbortedQ lists txnAborted's entries oldest first (an id noted again has a newer
	// entry too), at most Options.MaxTxns; txnAbortQ the abort decisions in the order
	// recorded, txnAbortDoneQ those every participant reported in the order they did
	// (txn_forget.go). txnVisited counts the entries their loops visited (tests). Guarded by
	// mu.
	txnAbortedQ   []txnAbortedEntry
	txnAbortQ     []txnAbortEntry
	txnAbortDoneQ []txnAbortEntry
	txnVisited    uint64
	// txnForgot remembers the decisions this node forgot as primary (a commit every
	// participant reported, an abort swept), so that a resent Decide or an Ask of one is
	// answered with it instead of deciding afresh (txn_forget.go, forgetDecision). A checkpoint
	// carries the newest Options.MaxTxns (carryTxns), so a restart keeps those and what the
	// replayed WAL holds. At most Options.TxnForgetMax, each kept
	// Options.TxnAbortKeep; txnForgotQ lists them oldest first. Guarded by mu.
	txnForgot    map[base.TxnID]txnForgotten
	txnForgotQ   []txnForgotEntry
	txnForgotSeq uint64
	// txnForgotLost is when (engine clock) a forgotten decision younger than
	// Options.TxnAbortKeep last gave way (past Options.TxnForgetMax, or not carried across a
	// restart): until TxnAbortKeep after it, a Decide(commit) of an unknown id with the lease
	// gone is refused with ErrTxnBusy instead of recording abort (it may be a resend of a
	// commit given way, its coordinator trusting the abort). Guarded by mu.
	txnForgotLost time.Time
	txnLocks      map[uint64]uint64 // frameKey -> slots of prepared rows
	// txnTables counts, per table id, the segments of prepared parts that write it (no
	// entry for none): tableLocked is one map read, whatever the parts hold.
	txnTables map[uint32]int
	txnKick   chan struct{}
	txnBytes  int64 // the prepare records the prepared parts hold
	// txnOwners is, per owner with a prepared part, its prepared parts and their bytes
	// (txn_quota.go); txnCarry the running checkpoint's carry of the parts (txn_quota.go).
	txnOwners map[uint64]txnOwnerUse
	// txnDecisionOwners counts the kept decisions of each owner (txn_decisions.go).
	txnDecisionOwners map[uint64]int
	txnCarry          txnCarry
	txnPrepared       int // the parts prepared, decision not applied (MaxTxns bounds them)
	// txnReplayed holds the parts replay rebuilt that are not forgotten yet, and
	// txnReplayedAt when the engine opened: the resolver logs once when they are settled
	// (txn_forget.go). Guarded by mu.
	txnReplayed   map[base.TxnID]struct{}
	txnReplayedAt time.Time
	// resolveCtx is the resolver loop's context, cancelled by Close (nil without the loop).
	resolveCtx    context.Context
	resolveCancel context.CancelFunc
	// txnBackoff is, per primary whose last resolver run failed, when the resolver next
	// calls it (txn_resolve.go); txnPass counts the passes (its pruning). Guarded by mu.
	txnBackoff map[string]*txnBackoff
	txnPass    uint64
	// replayForce lets replay's frame reservations pass the cache budget instead of
	// checkpointing while a txn is live (txn.go).
	replayForce bool
	// gapWaiters counts the batches waiting for a gap in their owner's seqs (under mu).
	gapWaiters int
	// refusedFresh is, for an owner without an owners-table entry (no batch applied yet),
	// the lowest seq of its refused batches (noteRefused): its later seqs are refused until
	// it sends that one again (freshRefusedGap). Under mu; memory only; at most
	// refusedFreshMax entries, an entry dropped once the owner's first batch is applied.
	refusedFresh map[uint64]uint64
	// ckptCarried is the last LSN the running checkpoint's carryTxns appended; under ckptMu.
	ckptCarried uint64

	identMu sync.Mutex             // guards idents; taken alone or inside mu
	idents  map[uint64]*ownerIdent // live owner identities (identity.go)

	// leaseMu lets leases be renewed without mu (RenewGrant, Renew: a checkpoint or a commit
	// holding mu never delays a renewal): tables, and every table's holder and epoch, are
	// written with mu and leaseMu held and read with either (before the engine is shared,
	// recovery writes them alone); every table's leaseUntil is read and written under leaseMu.
	// A leaf lock: taken alone, inside mu, inside identMu, or inside both.
	leaseMu sync.Mutex
	// leaseSeqs is every owner's last applied seq (ownerState.lastSeq), for RenewGrant's
	// grant; under leaseMu (written with mu held too, or alone in recovery).
	leaseSeqs map[uint64]uint64
	// shut mirrors closed for the renewals, which take no mu: set by Close, under mu.
	shut atomic.Bool

	ackMu      sync.Mutex
	durableLSN uint64        // every record <= it is acknowledged by the WAL
	durableAt  atomic.Uint64 // durableLSN, for readers that must not wait for ackMu (the event loop)
	dupAcks    []dupAck
	ackErr     error         // set when the WAL failed: waiters for durability get it
	durableCh  chan struct{} // closed (and cleared) when durableLSN advances or ackErr is set

	// walAcks are the done callbacks of the records handed to the WAL and not acknowledged
	// yet, in LSN order: appendRecord pushes under mu, the WAL's goroutine pops in walAck
	// (one method value for every record, so a commit allocates no closure).
	walAcksMu sync.Mutex // a leaf: taken alone, or inside mu
	walAcks   ackQueue
	walAckFn  func(uint64, error)

	failMu  sync.Mutex
	failErr error

	// backups are the running backups' holds on their snapshots; heldPages the disk pages
	// checkpoints replaced meanwhile, freed when the last hold ends (backup.go).
	backups   []*backupHold
	heldPages []heldPage

	// readBarriers counts the reads that waited for durability with mu held (read.go).
	readBarriers atomic.Uint64

	// verifySlots bounds the etcd grant verifications running at once (cluster.go);
	// verifyConns those of each connection (verify_slots.go).
	verifySlots chan struct{}
	verifyConns verifyConns
	leaseChecks leaseChecks // the Decides' lease checks running (txn_lease.go)
	// moveSelf is the address the partition map names this node by, as the last verified
	// move step gave it (move_verify.go); nil until one did.
	moveSelf atomic.Pointer[string]

	ckptReq chan struct{}
	stop    chan struct{}
	bg      sync.WaitGroup

	stats engineCounters
	// lat records the latencies of the WAL's fdatasyncs and of data-file page reads
	// (Latencies): any goroutine, no lock.
	lat engineLatencies
}

// table is one table's state. Fields other than io are guarded by Engine.mu; pages is also
// read under io.RLock (its writers hold both).
type table struct {
	id      uint32
	name    string
	geo     logicpage.Geometry
	cluster base.ClusterLayout // zero for a local table; set before the table is published, then immutable
	nextID  uint64

	holder     uint64    // also under Engine.leaseMu (see there)
	creator    uint64    // the owner whose CreateTableAs created it since Open (createdAs); not logged
	createdAs  bool      // created by CreateTableAs since Open: counts for creator while holder is 0
	epoch      uint64    // also under Engine.leaseMu
	leaseUntil time.Time // under Engine.leaseMu only
	// leaseAtOpen: leaseUntil is the lease Open gave the last holder (it may still be alive),
	// not renewed since; under Engine.leaseMu only. ErrTableOwned says so.
	leaseAtOpen bool
	dropping    bool   // under Engine.leaseMu only: DropTable is logging the drop
	writeLSN    uint64 // the last LSN that wrote the table: readers other than its holder wait for it
	// holderInc is the incarnation that held the holder's owner id when it was last granted
	// or renewed the table (zero: none known, as after a restart or in an embedded engine);
	// under Engine.leaseMu only. Only that incarnation reads the table as its holder
	// (holderReads): an owner id alone does not say who wrote the rows not durable yet.
	holderInc Incarnation
	// grantLSN, of a cluster table, is the LSN of its last etcd grant's ownership record (0:
	// durable since Open): the grant is answered as current only once the WAL is durable
	// through it (cluster.go).
	grantLSN uint64

	rows  *bitmaptree.Tree // row id -> present; the authority on which rows exist
	used  *bitmaptree.Tree // disk page -> referenced by the published map or being written
	pages *pageMap         // published page map (sealed: replaced, never changed)
	data  vfs.File

	io      sync.RWMutex // disk page reads (R) against publishing the page map and freeing pages (W)
	dropped bool
	dropLSN uint64
}

type dupAck struct {
	lsn  uint64
	done func(uint64, error)
}

// PageInfo is one page of a page directory: a page that holds rows, and which.
type PageInfo struct {
	Page    uint64
	Present uint64
}

func dataFileName(dir string, id uint32) string {
	return path.Join(dir, fmt.Sprintf("table-%08d.dat", id))
}

func walDir(dir string) string { return path.Join(dir, "wal") }

// Open opens (creating if needed) the store in opts.Dir and recovers it: catalog, published
// page map, WAL replay after the checkpoint LSN, bitmap-trees, dedup table. It fails with an
// error wrapping corrupt.ErrCorruption, naming the file and offset, when durable data is bad.
func Open(opts Options) (*Engine, error) {
	opts = opts.withDefaults()
	if opts.Dir == "" {
		return nil, errors.New("storenode: Options.Dir is empty")
	}
	e := &Engine{
		opts:        opts,
		fs:          opts.FS,
		dir:         opts.Dir,
		tables:      make(map[uint32]*table),
		byName:      make(map[string]*table),
		owners:      make(map[uint64]*ownerState),
		idents:      make(map[uint64]*ownerIdent),
		cache:       newPageCache(opts.CacheBytes),
		ckptReq:     make(chan struct{}, 1),
		verifySlots: make(chan struct{}, grantVerifySlots),
		ckptChunk:   ckptChunks{scanFrames: ckptScanFrames, copyBytes: ckptCopyBytes, installWrites: ckptInstallWrites},
		logSlack:    mapLogSlack,
		stop:        make(chan struct{}),
		start:       time.Now(),
	}
	e.leaseSeqs = make(map[uint64]uint64)
	e.txnParts, e.txnDecisions, e.txnLocks = make(map[base.TxnID]*txnPart), make(map[base.TxnID]*txnDecision), make(map[uint64]uint64)
	e.txnAborted = make(map[base.TxnID]time.Time)
	e.txnTables = make(map[uint32]int)
	e.txnOwners = make(map[uint64]txnOwnerUse)
	e.txnDecisionOwners = make(map[uint64]int)
	e.txnForgot = make(map[base.TxnID]txnForgotten)
	e.txnKick = make(chan struct{}, 1)
	e.cond = sync.NewCond(&e.mu)
	e.walAckFn = e.walAck
	if err := checkNotIncomplete(e.fs, e.dir); err != nil {
		return nil, err
	}
	err := e.recover()
	if err == nil {
		err = e.finishRestore() // a restored backup's first open (backup_dir.go)
	}
	if err != nil {
		// Recovery may fail after the WAL was opened (syncing the directory, removing
		// orphans): close it too, or its writer and its lock outlive the failed Open and
		// the store cannot be opened again in this process.
		if e.log != nil {
			e.log.Close()
		}
		e.closeFiles()
		return nil, err
	}
	e.bg.Add(1)
	go e.checkpointLoop()
	e.mu.Lock()
	if e.txnLive() {
		e.startResolver()
		e.kickResolver() // what replay rebuilt is settled now, not a TxnResolveInterval later
	}
	e.mu.Unlock()
	return e, nil
}

// SyncMode returns the engine's WAL sync mode.
func (e *Engine) SyncMode() SyncMode { return e.opts.Sync }

// LeaseDuration returns how long an ownership grant lives without renewal.
func (e *Engine) LeaseDuration() time.Duration { return e.opts.LeaseDuration }

// Close stops accepting work, waits for queued WAL appends, writes a final checkpoint and
// releases the directory. It is idempotent.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.shut.Store(true)
	e.cond.Broadcast()
	lost := e.dropProposals()
	e.mu.Unlock()
	for _, w := range lost {
		w.done(0, fmt.Errorf("%w: proposal given up: %w", ErrUnknownOutcome, ErrClosed))
	}
	close(e.stop)
	if e.resolveCancel != nil {
		e.resolveCancel()
	}
	e.bg.Wait()
	e.releaseAllBackups()

	var err error
	if e.failure() == nil {
		err = e.checkpoint(false)
	}
	if e.log != nil {
		if cerr := e.log.Close(); err == nil && cerr != nil && e.failure() == nil {
			err = cerr
		}
	}
	e.closeFiles()
	return err
}

func (e *Engine) closeFiles() {
	for _, t := range e.tables {
		if t.data != nil {
			t.data.Close()
		}
	}
	for _, t := range e.dropped {
		if t.data != nil {
			t.data.Close()
		}
	}
	if e.lock != nil {
		e.lock.Close()
		e.lock = nil
	}
}

// usable reports why the engine cannot take work, if it cannot. Caller holds mu.
func (e *Engine) usable() error {
	if e.closed {
		return ErrClosed
	}
	return e.failure()
}

func (e *Engine) failure() error {
	e.failMu.Lock()
	defer e.failMu.Unlock()
	return e.failErr
}

// fail makes the engine fail-stop: every later commit, grant and read returns ErrFailStop
// wrapping cause.
func (e *Engine) fail(cause error) error {
	e.failMu.Lock()
	if e.failErr == nil {
		e.failErr = fmt.Errorf("%w: %w", ErrFailStop, cause)
		e.opts.Logger.Error("storenode: fail-stop", "err", cause)
	}
	err := e.failErr
	e.failMu.Unlock()
	return err
}

// broadcastFailure wakes waiters after fail; it takes mu, so it must not be called with mu held.
func (e *Engine) broadcastFailure() {
	e.mu.Lock()
	e.cond.Broadcast()
	e.mu.Unlock()
}

func (e *Engine) table(id uint32) (*table, error) {
	t, ok := e.tables[id]
	if !ok {
		return nil, fmt.Errorf("%w: id %d", ErrTableNotFound, id)
	}
	return t, nil
}

func (t *table) info() base.TableInfo {
	return base.TableInfo{ID: t.id, Name: t.name, RowBytes: t.geo.RowBytes(), NextID: t.nextID, Rows: t.rows.Count(), Cluster: t.cluster}
}

// presentWord returns the present mask of a page from the table's bitmap-tree.
func (t *table) presentWord(page uint64) uint64 { return t.rows.Word(page * logicpage.RowsPerPage) }

func (t *table) entry(page uint64) mapEntry { return t.pages.get(page) }

// appendRecord hands a record to the WAL, which copies it, and returns its LSN. Caller holds
// mu, which keeps LSNs in the order of e.lastLSN; when the WAL's queue is full it waits under
// mu, which holds back every other writer too (backpressure; the WAL's goroutine never takes
// mu). done runs on the WAL's goroutine in LSN order and must not take mu. On error nothing
// was appended and done will not be called.
func (e *Engine) appendRecord(kind byte, payload []byte, force bool, done func(uint64, error)) (uint64, error) {
	e.onePiece[0] = wal.Piece{Bytes: payload}
	lsn, err := e.appendPieces(kind, e.onePiece[:], force, done)
	e.onePiece[0] = wal.Piece{}
	return lsn, err
}

// appendPieces is appendRecord with a payload of pieces: the WAL copies those without Keep
// and writes the kept ones from their memory, which must not change until done has run.
func (e *Engine) appendPieces(kind byte, payload []wal.Piece, force bool, done func(uint64, error)) (uint64, error) {
	if e.opts.Proposer != nil {
		// A replica's replicated paths propose (proposer.go); what reaches here is a kind
		// that is not replicated yet.
		return 0, fmt.Errorf("%w: record kind %d", ErrNotReplicated, kind)
	}
	lsn := e.lastLSN + 1
	e.walAcksMu.Lock()
	e.walAcks.push(pendingAck{lsn: lsn, done: done})
	e.walAcksMu.Unlock()
	var room <-chan struct{}
	for {
		err := e.log.AppendPiecesAsync(kind, payload, force, e.walAckFn)
		if err == nil {
			break
		}
		if !errors.Is(err, wal.ErrBusy) {
			e.walAcksMu.Lock()
			e.walAcks.popBack() // not queued: the WAL will not call back for it
			e.walAcksMu.Unlock()
			if errors.Is(err, wal.ErrFailStop) {
				err = e.fail(err)
			}
			return 0, err
		}
		// The queue is full. The room signal is taken only then (taking it before every
		// append would make the WAL's writer allocate a signal for every group), and before
		// the next attempt, so the space freed after that attempt's check is not missed.
		if room != nil {
			<-room
		}
		room = e.log.Room()
	}
	e.lastLSN = lsn
	n := 0
	for _, p := range payload {
		n += len(p.Bytes)
	}
	e.stats.walBytes.Add(uint64(n) + walRecordOverheadBytes)
	return lsn, nil
}

// walAck is the WAL's done callback of every record appendRecord hands it: it pops the
// record's own callback (records are acknowledged in LSN order) and runs it. On the WAL's
// goroutine.
func (e *Engine) walAck(got uint64, err error) {
	e.walAcksMu.Lock()
	a := e.walAcks.popFront()
	e.walAcksMu.Unlock()
	if a.lsn != got { // checked before Failf boxes its arguments
		assert.Failf("storenode: WAL acknowledged LSN %d, engine expected %d", got, a.lsn)
	}
	if err != nil {
		unknown := errors.Is(err, wal.ErrUnknownOutcome)
		err = e.fail(err)
		if unknown {
			// Written, or partly, then the write or fsync failed: the record may be found
			// after a restart, so the caller must not take it as a failure.
			err = fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
		}
		e.failDurable(err)
	} else {
		e.acknowledged(got)
	}
	a.done(got, err)
	if err != nil {
		go e.broadcastFailure()
	}
}

// pendingAck is a record handed to the WAL: its LSN and its caller's callback.
type pendingAck struct {
	lsn  uint64
	done func(uint64, error)
}

// ackQueue is a FIFO of pendingAcks in one slice that is reused once drained, so that a
// steady flow of records allocates nothing.
type ackQueue struct {
	items []pendingAck
	head  int
}

func (q *ackQueue) push(a pendingAck) {
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	} else if q.head > len(q.items)/2 && len(q.items) == cap(q.items) {
		n := copy(q.items, q.items[q.head:]) // more than half consumed: compact before growing
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, a)
}

func (q *ackQueue) popFront() pendingAck {
	if q.head == len(q.items) {
		return pendingAck{} // an acknowledgement nobody waits for: walAck's check fails
	}
	a := q.items[q.head]
	q.items[q.head] = pendingAck{}
	q.head++
	return a
}

func (q *ackQueue) popBack() {
	q.items[len(q.items)-1] = pendingAck{}
	q.items = q.items[:len(q.items)-1]
}

// walRecordOverheadBytes approximates a WAL record's header and padding, for the checkpoint
// trigger's count of WAL growth.
const walRecordOverheadBytes = 32

// acknowledged records that every LSN <= lsn is durable and answers retried batches that
// waited for it. Runs on the WAL's goroutine.
func (e *Engine) acknowledged(lsn uint64) {
	e.ackMu.Lock()
	e.durableLSN = lsn
	e.durableAt.Store(lsn)
	var ready []dupAck
	keep := e.dupAcks[:0]
	for _, a := range e.dupAcks {
		if a.lsn <= lsn {
			ready = append(ready, a)
		} else {
			keep = append(keep, a)
		}
	}
	e.dupAcks = keep
	if e.durableCh != nil {
		close(e.durableCh)
		e.durableCh = nil
	}
	e.ackMu.Unlock()
	for _, a := range ready {
		a.done(a.lsn, nil)
	}
}

// ackWhenDurable calls done once lsn is durable: the reply to a retried batch, with the
// batch's own LSN. If the WAL fails first, done gets the failure as an unknown outcome (the
// original may have reached the disk).
func (e *Engine) ackWhenDurable(lsn uint64, done func(uint64, error)) {
	e.ackMu.Lock()
	if lsn <= e.durableLSN {
		e.ackMu.Unlock()
		done(lsn, nil)
		return
	}
	if err := e.ackErr; err != nil {
		e.ackMu.Unlock()
		done(0, retriedFailure(err))
		return
	}
	e.dupAcks = append(e.dupAcks, dupAck{lsn: lsn, done: done})
	e.ackMu.Unlock()
}

func retriedFailure(err error) error {
	if errors.Is(err, ErrUnknownOutcome) {
		return err
	}
	return fmt.Errorf("%w: the retried batch's write failed: %w", ErrUnknownOutcome, err)
}

// failDurable ends every wait for durability with err: retried batches (dupAcks) and
// WaitDurable. Runs on the WAL's goroutine, or wherever the failure is seen.
func (e *Engine) failDurable(err error) {
	e.ackMu.Lock()
	if e.ackErr == nil {
		e.ackErr = err
	}
	waiting := e.dupAcks
	e.dupAcks = nil
	if e.durableCh != nil {
		close(e.durableCh)
		e.durableCh = nil
	}
	e.ackMu.Unlock()
	for _, a := range waiting {
		a.done(0, retriedFailure(err))
	}
}

// waitDurable waits until every record <= lsn is durable, or the WAL failed. It must not be
// called with mu held.
func (e *Engine) waitDurable(lsn uint64) error {
	for {
		e.ackMu.Lock()
		if lsn <= e.durableLSN {
			e.ackMu.Unlock()
			return nil
		}
		if err := e.ackErr; err != nil {
			e.ackMu.Unlock()
			return err
		}
		if e.durableCh == nil {
			e.durableCh = make(chan struct{})
		}
		ch := e.durableCh
		e.ackMu.Unlock()
		<-ch
	}
}

// durableThrough reports the durable LSN; it takes no lock.
func (e *Engine) durableThrough() uint64 { return e.durableAt.Load() }

// appendAndWait appends a record that must be durable before the caller continues (catalog
// changes, grants, in every sync mode) and waits for it, releasing mu meanwhile. Caller holds
// mu; it is held again on return.
func (e *Engine) appendAndWait(kind byte, payload []byte) error {
	ch := make(chan error, 1)
	if _, err := e.appendRecord(kind, payload, true, func(_ uint64, err error) { ch <- err }); err != nil {
		return err
	}
	e.mu.Unlock()
	err := <-ch
	e.mu.Lock()
	return err
}

func isNotExist(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, os.ErrNotExist)
}

func corruptTable(t *table, format string, args ...any) error {
	return corrupt.Errorf("storenode: table %d (%s): "+format, append([]any{t.id, t.name}, args...)...)
}
