package txnode

// Err returns why the DB can no longer serve, nil while it can: ErrClosed once Close ran, the
// storage node's unreachable error once the DB gave up on it (it stayed unreachable past
// Options.RequestTimeout, or a lease plus OwnerInUseMargin: every later call fails with it),
// or the error of the commit batch that failed the pipeline (an unknown outcome, a store
// refusal: every later commit fails with it). Each of them is for good: a DB does not
// recover; a caller that wants to go on closes it and opens a fresh one (cluster/node does).
// It takes two short locks; any goroutine may call it.
func (db *DB) Err() error {
	if db.closed.Load() {
		return ErrClosed
	}
	if rs, ok := db.store.(*remoteStore); ok {
		if err := rs.deadErr(); err != nil {
			return err
		}
	}
	return db.pipe.failure()
}

// deadErr is why the store stopped for good (giveUp, Close), nil while it serves.
func (s *remoteStore) deadErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dead
}

// DB returns the transaction node the table belongs to: a Tx uses only tables of its own DB.
func (t *Table) DB() *DB { return t.db }

// DB returns the transaction node the durable-read handle belongs to.
func (t *DurableTable) DB() *DB { return t.db }
