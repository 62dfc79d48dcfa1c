package server

import (
	"errors"

	"github.com/weftdb/weft/sgio"
)

// Errors of the server, grouped by when they occur; the engine's are storenode's (each one a
// client can meet travels as one of the wire's codes, package sgio). The texts keep the
// storage node's "storenode:" prefix, as do the server's log messages: they are the storage
// node's voice.
var (
	// Configuring.

	// ErrRoleSecrets is returned by New when two roles are configured with the same secret
	// (Config.Secret, PeerSecret, OperatorSecret, compared as keys): the server could not
	// tell them apart (roles.go).
	ErrRoleSecrets = errors.New("storenode: two roles configured with the same secret")

	// Starting.

	// ErrFileLimit is returned by Start when the process's file descriptor limit
	// (RLIMIT_NOFILE) cannot hold the tables' data files, the connections, the event loops
	// and a margin (limits.go).
	ErrFileLimit = errors.New("storenode: file descriptor limit too low")

	// Serving.

	// ErrTransportStopped is reported by Server.Healthy (and returned by Serve) once the
	// server's network transport stopped on its own: it no longer serves. It matches
	// sgio.ErrShuttingDown without reading as it.
	ErrTransportStopped = &sentinel{msg: "storenode: network transport stopped", parent: sgio.ErrShuttingDown}
)

// sentinel is an error with a fixed message that also matches its parent under errors.Is (as
// storenode's sentinels do).
type sentinel struct {
	msg    string
	parent error
}

// Error reports the sentinel's message.
func (e *sentinel) Error() string { return e.msg }

// Unwrap reports the parent, so errors.Is finds it.
func (e *sentinel) Unwrap() error { return e.parent }
