package server

import "fmt"

// File descriptors. Each live table (and each dropped one until a checkpoint removes it) keeps
// its data file open (Engine.OpenFiles); every connection holds a socket; every gnet event loop (and the
// acceptor's) holds an epoll instance and an eventfd (loopFiles); the WAL, the meta file,
// directory syncs and the listener need a few more (fileMargin). Go raises the soft
// RLIMIT_NOFILE to the hard limit at start, so that is the budget.
//
//   - At start a server refuses to run, with ErrFileLimit and the numbers, when its
//     connections (MaxConns plus the refused ones it lingers on), its event loops, its tables,
//     the descriptors the embedding process reserves for itself (Config.ReservedFiles: the
//     storenode binary's metrics listener and its connections) and the margin do not fit the
//     limit.
//   - The engine's CreateTable refuses a table beyond Options.MaxTables, and a failed data
//     file open fails that CreateTable only (storenode's limits.go). Accepting a connection
//     for want of descriptors is the accept loop's concern (server_accept.go).

// fileMargin is the descriptors a storage node needs beside its tables and connections.
const fileMargin = 64

// loopFiles is the descriptors of loops gnet event loops: an epoll instance and an eventfd
// each, and as many for the acceptor's loop.
func loopFiles(loops int) int { return 2 * (loops + 1) }

// checkFileLimit reports ErrFileLimit when conns connections, loops event loops, tables
// tables, reserved descriptors of the embedding process (Config.ReservedFiles) and the
// margin do not fit limit descriptors.
func checkFileLimit(conns, loops, tables, reserved int, limit uint64) error {
	need := uint64(conns) + uint64(loopFiles(loops)) + uint64(tables) + uint64(max(reserved, 0)) + fileMargin
	if need > limit {
		return fmt.Errorf("%w: %d connections + %d event loops (%d descriptors) + %d tables + %d reserved + %d spare need %d file descriptors, "+
			"RLIMIT_NOFILE is %d: raise the limit (ulimit -n, LimitNOFILE=) or lower --max-conns",
			ErrFileLimit, conns, loops, loopFiles(loops), tables, reserved, fileMargin, need, limit)
	}
	return nil
}
