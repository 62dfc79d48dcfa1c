package storenode

import (
	"fmt"

	"github.com/weftdb/weft/base"
)

// What a storage node's server checks before it lets a client touch a table or a
// transaction part that may be another owner's (storenode/server's roles, docs/operations.md
// "Roles and credentials").

// TableOnlyHeldBy reports whether no owner but owner ever held table name here: it was
// never granted (epoch 0), or owner holds, or last held, its first grant (epoch 1: every
// grant bumps the epoch and the epoch is logged, grants.go). A cluster table's grants are
// etcd's, registered here with etcd's epochs: for it, whether its registered holder is owner
// or none (etcd, not this node, decides who may be granted it). ErrTableNotFound for no such
// table. Any goroutine.
func (e *Engine) TableOnlyHeldBy(name string, owner uint64) (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	t, ok := e.byName[name]
	if !ok {
		return false, fmt.Errorf("%w: %q", ErrTableNotFound, name)
	}
	e.leaseMu.Lock()
	defer e.leaseMu.Unlock()
	if t.holder != 0 && t.holder != owner {
		return false, nil
	}
	return t.cluster.IsCluster() || t.epoch <= 1, nil
}

// ApplyTxnAs is ApplyTxn on behalf of owner (a coordinator's session): a part of id that
// this node holds prepared for another owner is refused, untouched, with an error wrapping
// sgio.ErrForbidden. The check and the apply run under one hold of the engine lock. A part
// not held (never prepared here, or applied and forgotten) and an applied part are ApplyTxn's
// to answer: no prepared rows remain there to change.
func (e *Engine) ApplyTxnAs(id base.TxnID, d base.Decision, owner uint64) error {
	return e.applyTxn(id, d, decider{owner: owner})
}
