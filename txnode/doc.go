// Package txnode is Weft's transaction node: the library a game server links to get a CRUD
// and transaction API over fixed-size rows, served from a small logical page cache, backed by
// a storage node over TCP (Options.StoreAddr) or by an in-process storage engine
// (Options.Dir, the embedded default). Both stores implement the Store interface (store.go),
// so every test and benchmark runs both ways.
//
// # Using it
//
//	db, err := txnode.Open(ctx, txnode.Options{Dir: "data"})
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
//	scan.go        Scan in id order, page directory to skip empty ranges, phantom protection
//	session.go     asynchronous commits (Session.Go, Pending)
//	pipeline.go    commit pipeline: group commit (Durable), flush epochs (WriteBack), failure
//	cache.go       the logical page cache: frames, budget, CLOCK, pins; pagetable.go its index
//	read.go        cache misses and fills
//	ids.go         row id allocation from whole pages granted by the store
//	pin.go         page pin sets (transaction and group-transaction cache policies)
//	typed.go       typed rows over a RowCodec
//	store.go       the Store interface; localstore.go (embedded), remotestore.go (TCP)
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
// The cache never holds more than CacheBytes (frames, version words and metadata). Pages pinned
// by running transactions or pin sets, and pages holding rows not yet acknowledged, are never
// evicted; when nothing can be evicted a request waits up to CacheWait, then fails with
// ErrCacheFull.
//
// A node owns the tables it opens: the storage node grants (owner, epoch) and a lease the node
// renews every quarter lease; the node stops serving a table (reads included) at three
// quarters of a lease without renewal. Another node is granted the table only after the lease
// has expired. A node that restarts with the same Options.OwnerID takes its tables back at once
// and continues its batch sequence; with a random owner id it waits out the old lease.
//
// After a commit batch fails (the storage node is fail-stop, the node was fenced, or the
// connection could not be re-established within RequestTimeout), the node stops committing:
// the failed batch's and every later batch's transactions return the error, the frames they
// touched are invalidated, and the DB must be reopened. The remote store reconnects on its own
// after a broken connection and resends the batches in flight with the same (owner, epoch,
// seq), which the storage node applies at most once.
package txnode
