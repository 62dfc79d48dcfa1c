package server

import (
	"errors"
	"fmt"

	"github.com/weftdb/weft/sgio"
)

// Errors of the server, grouped by when they occur; the engine's are storenode's (a client
// meets them as the wire's sentinels, package sgio). The texts keep the storage node's
// "storenode:" prefix, as do the server's log messages: they are the storage node's voice.
var (
	// Starting.

	// ErrFileLimit is returned by Start when the process's file descriptor limit
	// (RLIMIT_NOFILE) cannot hold the tables' data files, the connections, the event loops
	// and a margin (limits.go).
	ErrFileLimit = errors.New("storenode: file descriptor limit too low")

	// Serving.

	// ErrTransportStopped is reported by Server.Healthy (and returned by Serve) once the
	// server's network transport stopped on its own: it no longer serves.
	ErrTransportStopped = fmt.Errorf("storenode: network transport stopped: %w", sgio.ErrShuttingDown)
)
