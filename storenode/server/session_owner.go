package server

import (
	"fmt"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// The session's owner: its leases renewed by its traffic (renew, renewGrant on the loop) and
// the checks that a request acts for the owner id this connection holds (checkOwner,
// checkHolder).

// renewGrant answers a lease renewal (an Acquire with the epoch of a grant) on the loop:
// Engine.RenewGrant takes no engine lock, so neither a checkpoint nor the commits holding it,
// nor the goroutines of other requests, delay the reply; it leaves in the loop's own write at
// the end of the turn. A renewal refused (ErrFenced, ErrTableNotFound) is answered the same
// way.
func (s *session) renewGrant(id uint64, a *sgio.Acquire) {
	err := s.checkHolder(a.Owner)
	var g base.Grant
	if err == nil {
		g, err = s.srv.eng.RenewGrantFrom(a.Table, a.Owner, a.Epoch, s.id)
	}
	if err != nil {
		s.replyError(id, err, false)
		return
	}
	s.replyLoop(id, &sgio.Grant{Table: g.Table, LeaseMillis: uint32(min(g.Lease.Milliseconds(), 1<<32-1)),
		Owner: g.Owner, Epoch: g.Epoch, LastSeq: g.LastSeq})
}

// renewDue reports, on the loop, whether the owner's leases are due for renewal: traffic
// renews them at most every eighth of a lease. The engine's clock is read once per turn.
func (s *session) renewDue() bool {
	if s.owner == 0 {
		return false
	}
	if s.turnNow == 0 {
		s.turnNow = s.srv.eng.Now().UnixNano()
	}
	return s.turnNow-s.lastRenew.Load() >= s.srv.leaseNanos/8
}

// renew extends the owner's leases if due: any traffic from the owner counts. The loop calls
// it for every request (Engine.Renew takes no engine lock, only its lease and identity
// locks for a few stores), and request goroutines before their request.
func (s *session) renew() {
	if s.owner == 0 {
		return
	}
	now := s.srv.eng.Now().UnixNano()
	last := s.lastRenew.Load()
	if now-last < s.srv.leaseNanos/8 || !s.lastRenew.CompareAndSwap(last, now) {
		return
	}
	s.srv.eng.Renew(s.owner)
}

// checkOwner refuses a request made for another owner than the session's.
func (s *session) checkOwner(owner uint64) error {
	if owner != s.owner {
		return fmt.Errorf("storenode: session of owner %d sent a request for owner %d: %w", s.owner, owner, sgio.ErrFenced)
	}
	return nil
}

// checkHolder is checkOwner for a request about to act as the owner (a commit handed to the
// engine, an Acquire, an AllocIDs, a DropTable): it also fails once a later claim replaced this
// connection's identity, whose close is still on its way, or the id was released. That refusal
// is storenode.ErrIdentityLost (wire code IdentityLost), never ErrFenced: it says nothing of
// the owner's grants, and a transaction node that took it for a fence would latch a table whose
// grant is fine; it sends the request again on its current connection instead.
func (s *session) checkHolder(owner uint64) error {
	if err := s.checkOwner(owner); err != nil {
		return err
	}
	if owner != 0 && !s.srv.eng.HoldsIdent(owner, s.id) {
		return fmt.Errorf("storenode: owner %d, connection %d (replaced or released): %w", owner, s.id, storenode.ErrIdentityLost)
	}
	return nil
}
