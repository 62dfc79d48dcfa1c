// Package txnode is Weft's transaction node: the library a game server links to get a CRUD
// and transaction API over fixed-size rows, served from a small logical page cache, backed by
// a storage node over TCP (Options.StoreAddr) or by an in-process storage engine
// (Options.Dir, the embedded default). Both stores implement one interface, store.Store
// (package txnode/store, which documents the seam: who calls what, buffers, errors), so every
// test and benchmark runs both ways; a game server needs nothing from that package. The
// cluster coordinator's surface (two-phase commit, durable reads of unowned partitions, held
// writes, the cache turn, forgetting a table; package cluster/node) is package
// txnode/txncoord.
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
//	db.go          DB: Open, Close, tables (create, open, list, drop)
//	adopt.go       a table's ownership taken: its grant (local, or etcd's), released at Close
//	lease.go       lease renewal, serving (is the lease live), refusals latched
//	versions.go    the durable version: commit and read waits, failed ranges, held batches
//	table.go       Table: single-row operations (lock-free cache-hit Get), Update/View/Begin
//	tx.go          Tx: optimistic, serializable concurrency control (Silo-style)
//	tx_commit.go   a Tx's commit: rows locked, reads validated, installed; its wait
//	view.go        View: a function run on a row in place in the cache, version-checked
//	scan.go        Scan in id order, page directory to skip empty ranges, phantom protection
//	session.go     asynchronous commits (Session.Go, Pending)
//	pipeline.go    commit pipeline: admission, flush, close; pipeline_batch.go a commit's rows
//	               copied into a batch, the in-flight cost; pipeline_flight.go launch, retire
//	               in seq order, failure; pipeline_writeback.go WriteBack's flush epochs
//	cache.go       the logical page cache: frames, budget, CLOCK, pins; pagetable.go its
//	               index; cache_flight.go its rows in flight: flight records, ghosts
//	read.go        cache misses and fills
//	ids.go         row id allocation from whole pages granted by the store
//	pin.go         page pin sets (transaction and group-transaction cache policies) and
//	               table pins (Table.Pin: a table's or partition's pages held, within PinBytes)
//	tablestats.go  per-table cache hits and misses (Table.Stats)
//	typed.go       typed rows over a RowCodec
//	coord.go       the coordinator's surface handed to txncoord (internal/coordbridge)
//	prepare.go     two-phase commit's participant (txncoord.Prepare, Prepared.Apply, DecideTxn)
//	remotestore.go the remote store (TCP): dial, calls, the Store methods; the Store
//	               interface and the embedded store are package txnode/store
//	remotecommit.go  the remote store's batches in flight: the commit queue, sends, acks
//	remoteredial.go  its reconnection: redial with backoff, the outage, resend in flight
//
// # Contracts
//
// docs/txnode.md states each in full, with the reasons and the measurements.
//
//   - Durable (default): a commit returns once its batch is in the store's WAL, synced per
//     the sync mode; a transaction that read rows of a commit not yet durable waits for it.
//     WriteBack: commits return at once; flushed in atomic epochs every FlushInterval.
//   - Serializable, Tx.Scan included (page versions, per-table insert epoch). DB.Update,
//     Table.Update and Session.Go retry conflicts: closures may run more than once.
//     Table.Scan outside a transaction is per-row consistent, not a snapshot.
//   - The cache never exceeds CacheBytes (frames, metadata, page table, directory). Pinned
//     pages and unflushed WriteBack pages are never evicted; when nothing can be, a request
//     waits up to CacheWait, then ErrCacheFull. Table pins are bounded by PinBytes
//     (ErrPinBudget); batches in flight by InflightBytes.
//   - A node owns the tables it opens: (owner, epoch) and a lease renewed every quarter lease;
//     it stops serving a table at three quarters of a lease unrenewed. Cluster tables are
//     owned under an etcd grant (txncoord.Open) instead. A fenced grant is latched.
//   - One incarnation per owner id: another Open with the same OwnerID gets ErrOwnerInUse
//     until the first closed or was silent for a lease.
//   - After a commit batch fails the node stops committing; the DB must be reopened. A WAL
//     write or fsync failure at the store is ErrUnknownOutcome. The remote store reconnects
//     and resends in-flight batches under the same (owner, epoch, seq).
//
// # Rules
//
//   - A Tx belongs to one goroutine and to the call that handed it out; after it, every
//     method returns ErrTxDone. A panic in a closure rolls back and propagates.
//   - Rows given to Put/Insert are exactly the row size and copied before return. Slices
//     passed to Update's and View's fn are valid only during fn (View's is the cached row:
//     never keep or write it). A scan's Row.Data is valid until the next row.
//   - Errors are sentinels (errors.go), wrapped with %w; errors.Is works across TCP. nil:
//     committed; ctx error, ErrConflict and the like: nothing applied; ErrUnknownOutcome:
//     installed, durability unknown.
//   - Every wait (miss, full cache, commit, undurable row) blocks only its own goroutine and
//     ends when its context does.
//   - Two-phase commit (txncoord.Prepare, DecideTxn, Prepared.Apply) locks rows in this cache
//     until applied; a Prepare that finds a row locked fails at once with ErrConflict.
//   - No callback on a connection's receiver goroutine blocks or spins; nobody waits for a
//     row lock on a goroutine a committer's waits depend on (docs/txnode-concurrency.md).
//   - WriteBack epochs are cut, numbered and handed to the store one at a time, in order.
package txnode
