package storenode

import (
	"context"
	"fmt"
	"sync"
)

// Grant verification slots. At most grantVerifySlots etcd reads run at once, each bounded by
// Options.GrantVerifyTimeout. Anyone with a client credential can send registrations, made up
// ones too, and each costs an etcd read: eight connections' made-up registrations held all 16
// slots while the rightful owner's waited ~5 s or was refused (issue 22, defect 10). So:
//
//   - A storage node's connection (conn != 0) holds at most grantVerifyConnMax slots at
//     once, and its second only while at least half the slots are free: eight connections
//     hold nine slots at most, never all sixteen, and a connection holding none takes any free
//     slot.
//   - A connection's registration that finds no slot it may take is refused at once with
//     ErrGrantUnverified (a busy code: the client asks again), never queued behind the
//     others'.
//   - The engine's own callers (conn 0: an embedded transaction node, a drop's check) wait
//     for a slot, bounded by their context and GrantVerifyTimeout.

// grantVerifyConnMax bounds the verifications one connection runs at once.
const grantVerifyConnMax = 2

// verifyConns counts each connection's verifications running.
type verifyConns struct {
	mu   sync.Mutex
	held map[uint64]int // conn -> slots held; no entry for none
}

// takeVerifySlot takes a verification slot for connection conn (0: the engine's own caller,
// which waits for one while ctx lasts), or refuses at once (ErrGrantUnverified) when conn may
// take none now. The caller gives it back with releaseVerifySlot(conn).
func (e *Engine) takeVerifySlot(ctx context.Context, conn uint64) error {
	if conn == 0 {
		select {
		case e.verifySlots <- struct{}{}:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("%w: wait for a grant verification slot: %w", ErrGrantUnverified, ctx.Err())
		case <-e.stop:
			return ErrClosed
		}
	}
	select {
	case <-e.stop:
		return ErrClosed
	default:
	}
	v := &e.verifyConns
	v.mu.Lock()
	defer v.mu.Unlock()
	n := v.held[conn]
	free := cap(e.verifySlots) - len(e.verifySlots)
	if n >= grantVerifyConnMax || (n > 0 && 2*free < cap(e.verifySlots)) {
		return fmt.Errorf("%w: this connection has %d grant verifications running, %d of %d slots free: ask again",
			ErrGrantUnverified, n, free, cap(e.verifySlots))
	}
	select {
	case e.verifySlots <- struct{}{}:
	default:
		return fmt.Errorf("%w: all %d grant verification slots are busy: ask again", ErrGrantUnverified, cap(e.verifySlots))
	}
	if v.held == nil {
		v.held = make(map[uint64]int)
	}
	v.held[conn] = n + 1
	return nil
}

// releaseVerifySlot gives back a slot of takeVerifySlot.
func (e *Engine) releaseVerifySlot(conn uint64) {
	if conn != 0 {
		v := &e.verifyConns
		v.mu.Lock()
		if v.held[conn]--; v.held[conn] <= 0 {
			delete(v.held, conn)
		}
		v.mu.Unlock()
	}
	<-e.verifySlots
}
