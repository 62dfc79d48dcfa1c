// Package txnode is Weft's transaction node: the library a game server links to get a CRUD
// and transaction API over fixed-size rows, served from a small logical page cache, backed by
// a storage node over TCP (Options.StoreAddr) or by an in-process storage engine
// (Options.Dir, the embedded default). Both stores implement one interface, store.Store
// (package txnode/store, which documents the seam: who calls what, buffers, errors), so every
// test and benchmark runs both ways; a game server needs nothing from that package.
//
// # Using it
//
//	db, err := txnode.Open(ctx, txnode.Options{Dir: "data"})
//	defer db.Close(ctx)                         // flushes and waits (see Options.Durability)
//	items, err := db.CreateTable(ctx, "items", 64)
//	id, err := items.Insert(ctx, row)
//	err = items.Get(ctx, id, buf)
//	err = db.Update(ctx, func(tx *txnode.Tx) error { ... })   // serializable, retried
//	p := db.Session().Go(ctx, func(tx *txnode.Tx) error { ... }) // asynchronous commit
//
// # Files
//
//	db.go          DB: Open, Close, tables, ownership and lease renewal, durable version
//	table.go       Table: single-row operations (lock-free cache-hit Get), Update/View/Begin
//	tx.go          Tx: optimistic, serializable concurrency control (Silo-style)
//	view.go        View: a function run on a row in place in the cache, version-checked
//	scan.go        Scan in id order, page directory to skip empty ranges, phantom protection
//	session.go     asynchronous commits (Session.Go, Pending)
//	pipeline.go    commit pipeline: group commit (Durable), flush epochs (WriteBack), failure
//	cache.go       the logical page cache: frames, budget, CLOCK, pins; pagetable.go its index
//	read.go        cache misses and fills
//	ids.go         row id allocation from whole pages granted by the store
//	pin.go         page pin sets (transaction and group-transaction cache policies) and
//	               table pins (Table.Pin: a table's or partition's pages held, within PinBytes)
//	tablestats.go  per-table cache hits and misses (Table.Stats)
//	typed.go       typed rows over a RowCodec
//	prepare.go     two-phase commit's participant: Tx.Prepare, Prepared.Apply, DB.DecideTxn
//	remotestore.go the remote store (TCP); the Store interface and the embedded store are
//	               package txnode/store
//
// # Contracts
//
// Durable (default): a commit returns once the storage node has the batch in its WAL, synced
// per its sync mode; a transaction that read rows of a commit not yet durable waits for that
// commit too, so nothing a caller saw can be lost. WriteBack: commits return at once and are
// flushed in atomic epochs every FlushInterval; a crash of this process loses at most the
// unflushed epochs, never part of one.
//
// Transactions are serializable, Tx.Scan included (page versions and a per-table insert epoch
// catch phantoms). DB.Update, Table.Update and Session.Go retry conflicts, so their closures
// may run more than once. Table.Scan outside a transaction reads each row consistently but is
// not a snapshot.
//
// The cache never holds more than CacheBytes: frames (rows and version words, as the
// allocator rounds them), metadata chunks, the page table and the chunk directory all count
// (a 64 KiB cache holds 11 pages of 64-byte rows). Pages pinned by running transactions or
// pin sets, and WriteBack pages with rows not yet flushed, are never evicted; when nothing can
// be evicted a request waits up to CacheWait (or its context), then fails with ErrCacheFull;
// a transaction whose working set can never fit fails with ErrCacheFull at once.
//
// Table.Pin holds every page of a table (a cluster partition is a table here) until Unpin:
// the pages below its id high-water mark, fetched before Pin returns, and the pages it gains
// while pinned. What table pins hold is bounded by Options.PinBytes (half of CacheBytes by
// default, at most three quarters): a Pin that would pass it fails with ErrPinBudget,
// nothing pinned; a page gained beyond it stays evictable (TableStats.PinOverflow). Pins hold
// frames the cache made within its budget, so they never make it exceed CacheBytes; a page
// it cannot make room for fails the Pin with ErrCacheFull. A pinned frame carries one pin
// (as a transaction's), so CLOCK skips it with no lookup; the budget keeps enough frames
// unpinned for the hand to find one within a few steps. Table.Stats counts the table's hits
// (single-row reads served from the cache: the lock-free path and transactions' reads) and
// misses (fetches from the store), each hit one increment of a per-P cell. Pages
// holding rows of commit batches not yet acknowledged may be evicted (each batch owns a copy
// of its rows): a later miss on such a row waits for the acknowledgement before it reads from
// the store, which may still answer with the older row until then. What the batches in flight
// hold is bounded by Options.InflightBytes instead.
//
// DropTable closes the table to new commits first (they fail with ErrTableNotFound; other
// tables keep working), flushes and waits for the commits admitted before, then drops it at
// the store; DropTable of a name this node has not opened flushes nothing.
//
// A node owns the tables it opens: the storage node grants (owner, epoch) and a lease the node
// renews every quarter lease; the node stops serving a table (reads included) at three
// quarters of a lease without renewal. Each table's renewal runs on its own goroutine, goes
// ahead of the connection's queued requests (sgio.Client.CallIntoUrgent) and is given until
// the lease it extends stops being usable, so a node whose goroutines keep the cores busy (a
// goroutine woken then waits its turn behind them, over a second measured) does not give up a
// renewal that could still succeed. The lease clock (monotonic) is read once per table when
// a transaction first touches it and once per table at its commit, read-only or not (all its
// reads were then served under a live lease), once per Table.Get, and once per page of a
// Table.Scan (which has no commit to check at): never once per row.
// Another node is granted the table only after the lease
// has expired or been released: Close releases (after its last batch is durable), so the next
// node, with any owner id, gets the tables at once. Each Open picks a random incarnation, sent
// in every Hello: a reconnect of the same Open replaces its old connection at once, while
// another Open with the same Options.OwnerID is refused with ErrOwnerInUse until the first one
// closed or was silent for a lease (Open retries for Options.OwnerInUseWait). So a restart
// after a crash with a fixed owner id waits up to a lease, then continues the batch sequence;
// with a random owner id it waits out the old tables' leases (ErrTableOwned meanwhile). Two
// live nodes never share an owner id. docs/operations.md, "Restarting or replacing a
// transaction node".
//
// A cluster-managed table (docs/cluster.md; the store reports it, store.Table.Cluster) is
// owned under an etcd grant instead: Options.Grants (package cluster's TxGrants) gives its
// epoch, which the node registers with the store (which verifies it in etcd), and a check
// that replaces the lease: the node serves the table, reads included, only while the grant's
// check passes (ErrLeaseExpired otherwise), and runs no lease renewal for it: in its place
// the renewal loop re-registers the current grant with the store every renewal period (a
// quarter lease; GrantRecheckInterval over an embedded store), off every read and write path,
// so a node that only reads hears of a fence or a drop at the store within a period. A grant
// the store fences at registration is released and taken again once; Close and DropTable
// release the grants (an open that registers after Close released them releases its own:
// ErrClosed). A grant the store fences later (ErrFenced on a commit batch, an id grant or a
// re-registration) is latched: the table stops serving even while the etcd check still
// vouches; a table the store no longer has (ErrTableNotFound at a re-registration) is latched
// as gone and serves ErrTableNotFound. A grant lost for
// good leaves the table unserved on this DB (a new DB acquires anew). Concurrent opens of one
// table take its grant once.
//
// After a commit batch fails (the storage node is fail-stop, or the node was fenced), the
// node stops committing:
// the failed batch's and every later batch's transactions return the error, the frames they
// touched are invalidated, and the DB must be reopened. A batch whose WAL write or fsync failed
// at the storage node returns ErrUnknownOutcome (it may survive a restart), never a plain
// failure. The remote store reconnects on its own
// after a broken connection, for as long as the DB is open, and resends the batches in flight
// with the same (owner, epoch, seq), which the storage node applies at most once: an outage
// fails no batch. Past RequestTimeout into an outage, calls fail at once with ErrUnavailable
// (commits refused with nothing applied; a committer whose batch is in flight gets
// ErrUnknownOutcome) until the storage node is back; the leases that lapsed meanwhile are
// renewed then (docs/operations.md, "The game server's side: a storage node outage").
//
// # Rules: what a Tx, a Row and an error guarantee
//
// A Tx belongs to one goroutine and to the call that handed it out: the closure of
// DB.Update, DB.View or Session.Go while it runs, or Begin's caller until Commit or Rollback.
// After that every method of it returns ErrTxDone, for ever: a kept *Tx never acts inside
// another transaction. A closure may run more than once (conflicts are retried), so it must
// have no effects outside the transaction; an error it returns is returned only if what it
// read was still current at the end (otherwise it runs again). A panic in a closure, or in a
// scan's loop body, rolls the transaction back (nothing written, nothing left pinned) and goes
// on up the caller's goroutine with its own value and stack; the DB stays usable. A
// transaction from Begin is its caller's to end: defer tx.Rollback() (a no-op after Commit).
//
// Rows: a row given to Put or Insert must be exactly the table's row size (nil and empty rows
// are ErrRowSize too); it is copied before the call returns, so the caller may reuse it. Get
// fills the caller's buffer (of the row size) before it returns. The slice Update passes to
// its fn is valid only during fn. So is the slice View (Table.View, Tx.View) passes to its
// fn, which is the row in the cache itself, not a copy: fn may run more than once, may see a
// row being overwritten in a run that is thrown away (so it must not fail on any bytes), and
// must neither keep nor write the slice (view.go has the rules). A scan's Row.Data is the scan's own copy: it stays valid
// until the loop asks for the next row, whatever the loop body does (Update other rows, run
// another scan); copy it to keep it longer.
//
// Errors are this package's sentinels (errors.go) or the storage node's, wrapped with %w,
// for errors.Is, which works across TCP too. What a write's error says about its outcome:
//
//   - nil: committed. Durable: durable. WriteBack: installed, visible, durable at the next
//     flush (see Durability for what a crash loses).
//   - the context's own error (context.Canceled, context.DeadlineExceeded, not wrapped in
//     ErrUnknownOutcome), ErrConflict, ErrRowSize, ErrReadOnly, ErrTxDone, ErrNotFound,
//     ErrTableNotFound, ErrLeaseExpired, ErrCacheFull, ErrClosed, or the closure's own error:
//     nothing was applied. A context done before the transaction is installed (its rows
//     visible to others) always ends here.
//   - ErrUnknownOutcome (wrapping the context's error): the context ended after the
//     transaction was installed, while it was being made durable. It is visible to this
//     node and may or may not survive a crash; Table.Insert still returns the id it used.
//     Retry only what is idempotent for the game.
//   - a commit batch's failure (the store's write or fsync failed, the node was fenced, the
//     connection could not be re-established): the batch may survive a restart of the
//     storage node; this node stops committing and must be reopened (see Contracts).
//
// Waits: a call blocks only its own goroutine: on a cache miss (the store's round trip), on a
// full cache (up to CacheWait), on a commit (Durable: until durable) and on a row whose commit
// is not yet durable (Durable). Each such wait ends when the call's context does.
//
// # Two-phase commit (a coordinator's API)
//
// A coordinator over several storage nodes (package cluster/node) runs one Tx per DB (from
// Begin) and commits them atomically (docs/cluster.md, "Two-phase commit"): Tx.Prepare
// validates as Commit does and sends the write set as one TxnPrepare under the owner's next
// seq (no batch after it is launched until it is answered; a refused prepare gives its seq
// back), keeping the rows locked in this cache; DB.DecideTxn records the decision at the
// primary; Prepared.Apply applies it at this DB's storage node and only then installs the
// rows (commit, under a new commit version) or unlocks them (abort). A row locked so is
// waited for by local readers and writers, within their contexts, and never seen before it
// is installed; a transaction that read it before fails validation with ErrConflict, and a
// Prepare that finds a row to write locked fails at once with ErrConflict (no waiting while
// holding locks: two coordinators could deadlock). The locks do not survive this process:
// after a crash the storage nodes' resolvers finish the transaction. Ordinary
// single-store transactions are unchanged (one commit batch).
//
// # Concurrency rules
//
// These are the rules the implementation relies on; docs/txnode-concurrency.md explains them.
//
// Who may block where. A goroutine that calls the API may block, always within its context:
// waiting for a cache frame (pin: also CacheWait), for a locked row (rowwait.go: a few
// yields, then parked until the row is unlocked), for the cache turn, for room in the commit
// pipeline (add: a commit whose context ends there is not installed), for durability
// (waitDurable) and for the remote store's reconnect. Nothing spins for longer than a few
// yields. A committer holds its rows locked from lockRow to install and may wait in the
// pipeline's add meanwhile (a full open batch, the WriteBack epoch bound): so nobody may wait
// for a row lock on a goroutine those waits depend on. No callback on a connection's
// receiver goroutine blocks or spins: Read's fill skips slots that are locked (the locker
// makes them valid, or its abort leaves them invalid to fetch again) and Commit's done only
// records the outcome. The WriteBack flusher and the Durable sender call the store's Commit
// themselves.
//
// The insert epoch (Silo). A commit that inserts into a table bumps the table's insert epoch
// once, with its write set locked and before it validates. A Tx.Scan whose range reaches ids
// this node may still insert (its grants, or past the high-water mark idHigh) and a Tx.Get of
// an id past idHigh record the epoch; validation fails if it moved, discounting the
// transaction's own bumps. A reader that validates after the bump aborts; one that validated
// before is serialized before the inserter. An inserter that recorded the epoch bumps it only
// from that value (else it aborts, bumping nothing), so two that race do not abort each other.
//
// Fresh slots. A page's slots whose ids this node has not handed out yet hold no row
// anywhere, so a frame may be created with them valid and absent; the mask is computed
// when the frame is created (idAllocator.freshOf), not when the inserting id was taken.
//
// What a closure's error means. DB.Update and DB.View return a closure's own error only once
// what the closure read is durable (Durable mode, as Get); if a batch it read from failed,
// the closure runs again. Session.Go's Pending.Wait does the same wait; if the batch failed
// it returns that failure (the closure cannot run again there).
//
// WriteBack epochs are cut, numbered and handed to the store one at a time, in cut order.
//
// The cache turn. A transaction sent back because the cache was full while it held frames
// (errCacheBusy) parks for the cache turn (one holder at a time); its next attempt may wait
// for frames while holding some, and while it waits nobody else takes a new frame. So a tiny
// cache serializes transactions instead of thrashing.
//
// # Measured
//
// 2-core dev machine (AMD EPYC, linux/amd64, go1.26.8), 2026-11-30, 64-byte rows, every row
// cached unless said, medians of 3, the machine shared with other jobs (load 3-8), so absolute
// figures are pessimistic:
//
//	go test ./txnode -run '^$' -bench . -cpu 1,2 -count 3 -benchmem
//
//	benchmark (128 goroutines unless said)         cpu=1        cpu=2       allocs/op
//	Get, Durable, 1 goroutine                       127 ns       167 ns      0
//	Get, Durable                                    109 ns       141 ns      0   (9.2M/s, 7.1M/s)
//	Put, WriteBack                                1,698 ns     2,447 ns      0
//	Put, Durable, embedded, sync none             5,565 ns     6,121 ns      1
//	Update, WriteBack                               502 ns       954 ns      0
//	Update, Durable, embedded, sync none          4,131 ns     5,385 ns      1
//	Insert, Durable / WriteBack                   1,875 / 1,060 ns  1,561 / 1,077 ns
//	Transfer (2 rows), Durable / WriteBack        3,928 / 952 ns    4,319 / 1,486 ns
//	Session.Go, Durable / WriteBack               1,678 / 1,837 ns  1,468 / 1,184 ns
//
//	go test ./txnode -run '^$' -bench Remote -benchtime 2s -count 3
//
//	RemoteGetMiss (random Get missing a 1 MiB cache, over TCP)    2.6 us/op   385K/s, 17 allocs
//	RemoteUpdate (random Update, Durable, sync none, over TCP)    2.6 us/op   390K/s, 30 tx/batch
//
// Against the goals: cache-hit Get reaches 9.2M/s on one P and 7.1M/s on two (goal 10M/s; a
// profile shows ~91 ns of CPU per Get, 56% of it in the row copy's cache misses, so two idle
// cores give ~22M/s: the benchmark got a third of the machine). Remote random update (goal
// 1M/s) and remote miss (goal 1M/s) reach about 0.4M/s: a profile of RemoteUpdate puts 27% of
// CPU in syscalls (one read and one writev per batch per side, and futex wake-ups), 7% in
// time.Now (the lease check per row; since then once per table per transaction) and the rest spread over OCC, the engine's commit path and
// map lookups. Concurrent misses share ReadPages frames (remoteread.go: a read joins the
// frame queued and not yet written, up to 64 page wants; one reply, checked whole, fills and
// wakes its readers in turn): against one frame per miss, crudbench query-random at a 1 MiB
// cache over TCP went from 150K/s at 7.6 CPU us/op to 154K/s at 6.5 (medians of three
// alternating runs, 600 -> 538 net bytes per op).
//
// The remote store uses sgio's client over net.Conn with net.Buffers (one writev for every
// queued frame): its Ping round trip reaches 1.8M/s at 128 in flight against a plain loopback
// echo's 1.87M/s (docs/operations.md), so the connection is not the limit; gnet's client was
// not tried.
package txnode
