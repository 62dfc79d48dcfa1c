package txncoord

import (
	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/internal/coordbridge"
)

// CacheTurn is the cache turn for a retry loop that runs its own transactions (DB.Begin,
// then Commit or Rollback), as DB.Update's loop holds it (docs/txnode-concurrency.md, "The
// cache budget and the cache turn"): a transaction that needs a page while the cache is
// full and it holds others is sent back (its calls and Commit fail with txnode.ErrCacheFull,
// CacheBusy reports true); the loop rolls it back and parks for the turn (Wait), then runs it
// again holding the turn (Hold), so that its next attempt may wait for frames while holding
// some and the others yield to it, instead of failing or thrashing. The zero value is ready;
// one per retry loop, used by the loop's goroutine only; Release it when the loop ends (it
// holds the turn of at most one DB at a time: Wait for another DB's gives the held one back
// first, so two loops never hold one turn each while waiting for the other's).
type CacheTurn struct {
	t coordbridge.Turn[txnode.DB]
}

// CacheBusy reports whether tx stopped at a page it could not pin while the cache was full
// and it held others: what a retry loop must Wait on before it runs the transaction again.
// It is false once tx ended (Commit, Rollback): check it first.
func CacheBusy(tx *txnode.Tx) bool { return fn.CacheBusy(tx) }

// Wait rolls back tx, which must be CacheBusy, and parks with nothing of tx pinned until
// the loop holds the cache turn of tx's DB (at once when it holds it already). nil: begin
// the transaction again and Hold it. txnode.ErrCacheFull when the loop has been busy for
// longer than Options.CacheWait since its first Wait; the error of tx's context if it ends
// first. The caller must hold no other pins of that DB (roll its other transactions back
// first).
func (c *CacheTurn) Wait(tx *txnode.Tx) error { return fn.TurnWait(&c.t, tx) }

// Hold makes tx, just begun (before any read or write), run with the loop's cache turn
// when it holds the turn of tx's DB; else it does nothing.
func (c *CacheTurn) Hold(tx *txnode.Tx) { fn.TurnHold(&c.t, tx) }

// Release gives the turn back, if held. Call it once the loop ends, after its last
// transaction ended (committed or rolled back); the CacheTurn may be used again after, by a
// new loop (Options.CacheWait counts again from its first Wait).
func (c *CacheTurn) Release() { fn.TurnRelease(&c.t) }
