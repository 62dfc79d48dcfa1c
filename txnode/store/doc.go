// Package store is the seam between a transaction node (package txnode) and its durable
// store: the Store interface txnode talks to and the types that cross it. A game server never
// needs it; it is for a test that wraps a store, a custom deployment, or a tool that opens the
// embedded store with its own storenode.Options (a file system to count IO, say), each handed
// to txnode.Options.Store.
//
// # Who implements it
//
//   - The embedded store (OpenEmbedded, this package): an in-process storenode.Engine, no
//     TCP. txnode.Open uses it for Options.Dir.
//   - The remote store: a storage node over one pipelined sgio connection, with reconnection
//     and resends. It lives in txnode, unexported, because it is txnode's options (secret,
//     timeouts, OwnerInUseWait, logger) and errors; txnode.Open uses it for Options.StoreAddr.
//   - Wrappers of either, in tests (counting, delaying or failing calls).
//
// # Who calls, on which goroutine
//
// A store is used by one txnode.DB, and every method but Close may be called from many
// goroutines at once:
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
// Callbacks run on the store's goroutines and must not block: Read's fill (for the remote
// store, the connection's receiver goroutine; for the embedded one, the caller's) and
// Commit's done (the receiver, or the engine's WAL goroutine; for a batch refused or answered
// at once, such as a fenced, malformed or retried one or any after Close, the goroutine
// calling Commit, before Commit returns: hold no lock across Commit that done takes). Neither
// may call back into the store's blocking methods. A Commit may itself block (the engine waits for the batches
// before it in seq order, or for cache room); every other blocking method ends when its
// context does. (The embedded store checks the context before it starts: a call with a done
// context does nothing; once started, a catalog change or id grant waits for its WAL sync,
// which only the disk bounds.)
//
// # Buffers
//
//   - Read: reqs belongs to the caller and is not kept after Read returns. The rows fill gets
//     are the store's (a reply frame, an engine buffer): valid only during that call.
//   - PageDir appends to dst and returns it, like append.
//   - Commit: the batch, its fences, segments and every segment's rows must not change until
//     done is called, and the store does not touch them after it called done (the remote
//     store keeps them to resend after a reconnect; the embedded one copies them into its
//     WAL and cache before Commit returns). done is called exactly once.
//
// # Errors
//
// Errors are the storage node's sentinels (package storenode), wrapped with %w, so errors.Is
// works with them for both stores: the embedded engine's read "storenode: ...", and one that
// crossed TCP carries its wire code and matches the same sentinel (sgio.NewSentinel). By call:
//
//   - CreateTable: storenode.ErrTableExists, ErrBadName, ErrRowSize, ErrTooManyTables (over
//     TCP only its sgio.ErrBusy).
//   - OpenTable, DropTable, and any call naming a dropped table: storenode.ErrTableNotFound;
//     DropTable also ErrTableOwned (another owner's lease is live).
//   - Acquire: storenode.ErrTableOwned while another owner holds a live lease (epoch 0), and
//     ErrFenced for a renewal whose epoch is no longer the table's grant.
//   - AllocIDs and Commit: storenode.ErrFenced when (owner, epoch) is not the table's grant:
//     the node lost the table and must not write it.
//   - Commit's done: an unknown outcome, which may survive: storenode.ErrUnknownOutcome (the
//     batch's WAL write or fsync failed), or, from the remote store, txnode.ErrUnknownOutcome
//     (closed, or it gave up reconnecting, with the batch in flight);
//     ErrFailStop (the engine stopped after an IO failure; nothing of this batch applied),
//     ErrSeqGap, ErrSeqReused, ErrMalformed, ErrBatchTooLarge. txnode treats every commit
//     error as the end of committing for the DB.
//   - Read and PageDir: storenode.ErrTableNotFound, and corrupt.ErrCorruption for bad stored
//     bytes.
//   - Every blocking method: the context's error when it ended first (a request already
//     sent wraps sgio.ErrUnknownOutcome too); after Close, an error wrapping ErrClosed
//     (txnode.ErrClosed) from both stores, and storenode.ErrClosed too from the embedded one.
//   - Remote only: a broken connection is mended inside the store: reads, page directories,
//     table lookups, id grants, renewals and in-flight batches are sent again on the next
//     connection (CreateTable, DropTable and a first Acquire are not: they fail with the
//     connection's error, wrapping sgio.ErrConnClosed).
//     When no connection can be made in time, calls fail with the dial's error.
package store
