// Package storenode is Weft's storage engine: the durable copy of a set of tables (Engine).
// A transaction node embeds it in-process (txnode's local store), and the storage node
// serves it on the network (package storenode/server, binary cmd/storenode); the engine
// itself knows nothing of the network, so a game server that embeds it links no network
// stack. docs/storage.md describes its files, formats and contract.
//
// # Layout
//
// One concern per file, each opening with its invariants:
//
//	engine.go      Engine, Open's state, the WAL hand-off (appendRecord), fail-stop
//	options.go     Options, SyncMode and the defaults
//	catalog.go     tables by id and name; ids never reused
//	grants.go      grants (owner, epoch), leases, id grants (AllocIDs)
//	cluster.go     cluster-managed tables: etcd grants verified (GrantVerifier), never on
//	               trust, above the persisted floor; ids of the partition only; no lease timer
//	move.go        partition moves: a copy's move states, the change mark, MoveWrite
//	move_verify.go a request's move steps verified in etcd (MoveVerifier), as grants are
//	verify_slots.go etcd verification slots: at most 2 per connection, refused when none
//	identity.go    owner ids claimed by one live incarnation (Connect, Disconnect)
//	dedup.go       the owners table: last seq and the dedup window per owner
//	commit.go      the commit path: checks, seq order, WAL record, apply to the cache
//	read.go        reads (ReadRows, ReadRowsAs, PageDir): durable-only for non-holders
//	pagecache.go   the disk page cache: frames in slabs, partial frames, CLOCK
//	checkpoint.go  the checkpoint: copy dirty pages, write to free disk pages, publish
//	ckpt_defer.go  a checkpoint out of file descriptors: deferred and retried, not a fail-stop
//	meta.go        the meta file a checkpoint publishes (page maps, catalog, grants)
//	pagemap.go     a table's page map in memory: a sparse radix tree, versions by path copying
//	records.go     the engine's WAL record kinds and payloads (storenode/wal frames them)
//	applyrec.go    the apply of every record kind, one function per kind: replay's, and the
//	               live paths' after (grants: before) their append
//	proposer.go    a replica (Options.Proposer): records proposed, applied at commit by
//	               ApplyCommitted, the leader's pending overlay (docs/replication.md);
//	               records_repl.go: the kinds only a replica writes (owner, decision expiry)
//	txnstate.go    a replica's checkpoint's transaction and move states (txnstate-<index>)
//	txn.go         two-phase commit: its invariants, prepare, row locks, the resolver loop,
//	               the checkpoint's carry (records_txn.go: its WAL records)
//	txn_decide.go  the primary's decision (a compare-and-set), Asks, participants' reports
//	txn_apply.go   a participant's apply of a decision: write or drop the part, unlock
//	txn_forget.go  what a participant and a primary forget, and the forgotten decisions kept
//	txn_guard.go   the primary decides only a part it holds prepared, by its owner
//	txn_quota.go   per-owner bounds on prepared parts; the checkpoint's carry of them in chunks
//	txn_doubt.go   parts in doubt past TxnInDoubtAfter: listed, aborted by an operator
//	txn_decisions.go  per-owner bounds on kept decisions; those kept past TxnInDoubtAfter listed
//	txn_lease.go   a Decide's lease check: a verification slot, shared by the Decides of a lease
//	txn_repl.go    two-phase commit on a replica: proposed on the leader, applied everywhere
//	recovery.go    Open: lock, meta, WAL replay (applyRecord), bitmap-trees, dedup table
//	backup.go      online backup (Engine.Backup): a snapshot's files handed to a sink
//	backup_dir.go  a backup written to a directory (BackupDir) and the restore markers
//	check.go       the offline check of a store (Check; check_catalog.go, check_tables.go)
//	limits.go      file descriptors of tables (MaxTables, EMFILE); granted ids bound commits
//	stats.go       Stats, and the one table of stat descriptors (StatDescs) that the
//	               wire's StatsReply, Prometheus and `weft stats` derive from
//	serving.go     what a server needs beside the public API: ReadCached (never blocks,
//	               for an event loop), reply-size bounds, row sizes, clock, health
//	verify.go      invariant checks run by the model tests (weft_invariants tag)
//	errors.go      the engine's sentinels (a client's are the wire's, package sgio)
//
// # Goroutines
//
// Every exported method of Engine may be called from any goroutine. Most take the engine's
// lock (mu) and may wait: for the WAL's queue, for durability, for the disk. Those that never
// wait say so (ReadCached, Now, Failure): only they are for an event loop, with the identity
// claims of a handshake and a close (Connect, HoldsIdent, Disconnect), which take identMu
// alone, held for map updates only (identity.go). Commit's done runs
// on the WAL's goroutine, in LSN order, and Connect's evict on the claiming goroutine without
// the engine's lock: neither may block. RegisterGrant waits for etcd (Options.GrantVerifier)
// with no engine lock held: not for an event loop.
package storenode
