package txnode

// Err returns why the DB cannot serve, nil while it can: ErrClosed once Close ran (for good);
// ErrUnavailable while the storage node has been unreachable for longer than
// Options.RequestTimeout (not for good: the DB redials and serves again once it is back); or
// the error of the commit batch that failed the pipeline (an unknown outcome, a store
// refusal: every later commit fails with it, for good: a caller that wants to go on closes the
// DB and opens a fresh one, as cluster/node does). It takes two short locks; any goroutine
// may call it.
func (db *DB) Err() error {
	if db.closed.Load() {
		return ErrClosed
	}
	if err := db.unavailableErr(); err != nil {
		return err
	}
	return db.pipe.failure()
}

// unavailableErr is ErrUnavailable while the remote store is unavailable, nil otherwise (and
// for other stores). Lock-free when available.
func (db *DB) unavailableErr() error {
	if db.remote == nil {
		return nil
	}
	return db.remote.unavailableErr()
}

// outageC is closed while the remote store is unavailable; nil (never ready) for other
// stores. Lock-free.
func (db *DB) outageC() <-chan struct{} {
	if db.remote == nil {
		return nil
	}
	return db.remote.outageC()
}
