package txnode

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Waiting for a locked row. A row's version word carries its lock (versionLock): a committer
// holds it from lockRow to install (and may wait in the pipeline's add meanwhile, for as long
// as acknowledgements take), a fill for the time of one row copy. A goroutine that finds a row
// locked spins for a few yields at most, then parks until the row is unlocked or its context
// ends; it never spins for as long as a writer waits.
//
// Parking: waiters register in one of rowWaitShards shards (by frame and slot) and take the
// shard's channel; whoever unlocks a row (install, unlockAll, fill) closes the channel of its
// shard if anyone waits there. A waiter counts itself before it loads the word again, an
// unlocker stores the word before it loads the count (both sequentially consistent), so one
// of them sees the other: no wake-up is lost. Waiters of other rows of the shard wake too,
// find their row still locked and park again.
//
// No callback on a connection's receiver goroutine may wait here: fill skips locked slots
// instead (the locker's install makes them valid, or its abort leaves them invalid to be
// fetched again).

const (
	rowWaitShards = 64
	rowSpinMax    = 4 // yields before parking: a fill holds a row for one copy
)

type rowWaitShard struct {
	waiters atomic.Int32
	mu      sync.Mutex
	ch      chan struct{} // closed and cleared on a wake-up; made by the next waiter
	_       [40]byte
}

type rowWaits struct {
	shards [rowWaitShards]rowWaitShard
}

func (w *rowWaits) shard(m *frameMeta, slot int) *rowWaitShard {
	i := uintptr(unsafe.Pointer(m))/unsafe.Sizeof(frameMeta{}) + uintptr(slot)
	return &w.shards[i%rowWaitShards]
}

// wait returns once the row's word (slot of frame m) is not locked, or ctx's error. Any
// goroutine but a receiver's may call it.
func (w *rowWaits) wait(ctx context.Context, m *frameMeta, slot int, word *uint64) error {
	for range rowSpinMax {
		if atomic.LoadUint64(word)&versionLock == 0 {
			return nil
		}
		runtime.Gosched()
	}
	s := w.shard(m, slot)
	s.waiters.Add(1)
	defer s.waiters.Add(-1)
	for {
		s.mu.Lock()
		if s.ch == nil {
			s.ch = make(chan struct{})
		}
		ch := s.ch
		s.mu.Unlock()
		if atomic.LoadUint64(word)&versionLock == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			if atomic.LoadUint64(word)&versionLock == 0 {
				return nil
			}
			return ctx.Err()
		}
	}
}

// wake wakes the goroutines parked on the row (slot of frame m), which the caller has just
// unlocked. Cheap when nobody waits: one atomic load.
func (w *rowWaits) wake(m *frameMeta, slot int) {
	s := w.shard(m, slot)
	if s.waiters.Load() == 0 {
		return
	}
	s.mu.Lock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
	s.mu.Unlock()
}
