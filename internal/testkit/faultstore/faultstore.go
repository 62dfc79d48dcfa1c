// Package faultstore holds txnode/store.Store wrappers that inject a store's faults into a
// transaction node's tests (txnode's own, and those of packages built on it, as hashindex).
// It is a package of its own, not internal/testkit, because it imports txnode/store and so
// the engine: the engine's own tests import internal/testkit. Only tests import it.
package faultstore

import (
	"errors"
	"sync/atomic"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/txnode/store"
)

// ErrAckLost is the error LostAck reports for the acknowledgement it loses.
var ErrAckLost = errors.New("acknowledgement lost")

// LostAck applies every commit batch, but while Armed reports the acknowledgement of one as
// failed (ErrAckLost): a storage node that applied a batch whose acknowledgement never came
// back (a connection broken after the write, the resends exhausted), so the node gives up on
// a batch the store holds. Arming disarms itself after one batch. Any goroutine may arm it.
type LostAck struct {
	store.Store
	// Armed, once set, makes the next batch's acknowledgement fail.
	Armed atomic.Bool
}

// Commit applies b; while armed, its acknowledgement reports ErrAckLost instead of success.
func (s *LostAck) Commit(b *base.Batch, done func(uint64, error)) {
	if !s.Armed.CompareAndSwap(true, false) {
		s.Store.Commit(b, done)
		return
	}
	s.Store.Commit(b, func(lsn uint64, err error) {
		if err == nil {
			err = ErrAckLost
		}
		done(lsn, err)
	})
}
