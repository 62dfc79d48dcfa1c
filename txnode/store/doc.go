// Package store is the seam between a transaction node (package txnode) and its durable
// store: the Store interface txnode talks to and the types that cross it. Its implementations
// are the embedded store (OpenEmbedded: an in-process storenode.Engine, no TCP; txnode.Open
// uses it for Options.Dir), txnode's unexported remote store (one pipelined sgio connection
// to a storage node, with reconnection and resends; Options.StoreAddr) and tests' wrappers of
// either. A game server never needs it; a test, a custom deployment or a tool hands a store
// to txnode.Options.Store.
//
// A store is used by one txnode.DB; every method but Close may be called from many goroutines
// at once. Who calls each:
//
//	Info                 once, by txnode.Open, before anything else
//	CreateTable,         the API caller (DB.CreateTable, DB.Table, DB.Tables, DB.DropTable)
//	OpenTable, ListTables, DropTable
//	Acquire              epoch 0: the API caller opening a table; epoch != 0: the DB's lease
//	                     renewer, every quarter lease (only when Info's Lease > 0)
//	AllocIDs             an inserting goroutine, one at a time per table
//	Read, PageDir        the goroutine with a cache miss, or a scan
//	Commit               the commit pipeline's sender goroutine (Durable) or the WriteBack
//	                     flusher: a DB's batches one call at a time, in seq order
//	Ping                 the lease renewer, when the DB holds no table
//	Close                once, by DB.Close, after every batch was acknowledged (or its
//	                     context ended); nothing else is called after it
//
// Rules:
//
//   - Callbacks (Read's fill, Commit's done) run on the store's goroutines, must not block
//     and must not call the store's blocking methods. done may run on the goroutine calling
//     Commit, before Commit returns (a batch refused or answered at once, any after Close):
//     hold no lock across Commit that done takes. done is called exactly once.
//   - Commit may block (batches before it in seq order, cache room); every other blocking
//     method ends when its context does. The embedded store does nothing for a done
//     context; once started, a catalog change or id grant waits for its WAL sync.
//   - Read keeps no reqs after it returns; the rows fill gets are valid only during that
//     call. PageDir appends to dst and returns it, like append.
//   - A batch, its fences, segments and rows must not change until done is called; the
//     store does not touch them after.
//
// Errors are storenode's sentinels wrapped with %w, so errors.Is matches for both stores
// (over TCP through the wire code, sgio.NewSentinel). By call:
//
//   - CreateTable: storenode.ErrTableExists, ErrBadName, ErrRowSize, ErrTooManyTables (over
//     TCP only its sgio.ErrBusy). OpenTable, DropTable and any call naming a dropped table:
//     ErrTableNotFound; DropTable also ErrTableOwned (another owner's lease is live).
//   - Acquire: ErrTableOwned (epoch 0, another owner's lease live); ErrFenced (a renewal of
//     an epoch no longer the grant). AllocIDs and Commit: ErrFenced when (owner, epoch) is
//     not the table's grant.
//   - Commit's done: storenode.ErrUnknownOutcome (WAL write or fsync failed) or, remote,
//     txnode.ErrUnknownOutcome (closed, or gave up reconnecting, batch in flight);
//     ErrFailStop (nothing of the batch applied), ErrSeqGap, ErrSeqReused, ErrMalformed,
//     ErrBatchTooLarge. txnode ends committing for the DB on any commit error.
//   - Read and PageDir: ErrTableNotFound; corrupt.ErrCorruption for bad stored bytes.
//   - Every blocking method: the context's error (a request already sent wraps
//     sgio.ErrUnknownOutcome too); after Close, an error wrapping ErrClosed
//     (txnode.ErrClosed), and from the embedded store storenode.ErrClosed too.
//   - Remote only: a broken connection is mended inside the store and reads, page
//     directories, table lookups, id grants, renewals and in-flight batches are resent;
//     CreateTable, DropTable and a first Acquire fail with the connection's error (wrapping
//     sgio.ErrConnClosed). With no connection in time, calls fail with the dial's error.
//
// Reasons and the full text: docs/txnode.md, "The store seam".
package store
