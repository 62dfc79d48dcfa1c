package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weftdb/weft/cluster/internal/testhook"
)

// MapWatcher keeps a local copy of the partition map, kept current by an etcd watch. Map
// reads the copy without a lock or a round trip; the copy may be behind etcd by the watch's
// delay (and, while etcd is unreachable, by as long as that lasts). A stale copy only
// misroutes: the storage node of a partition is the authority on whether it serves it (and,
// after a move, fences the old copy), so a caller that is refused reads the map again
// (WaitRevision) and retries. Its methods may be called from any goroutine.
type MapWatcher struct {
	c      *Client
	cur    atomic.Pointer[Map]
	mu     sync.Mutex
	change chan struct{} // closed and replaced on every new snapshot; guarded by mu
	// progress asks the watch goroutine for a progress notification (Sync). Only that
	// goroutine asks etcd, while its watch is open: a progress request for a watch context
	// with no open watch makes the etcd client open a watch stream that outlives the
	// watcher (until the client closes).
	progress chan struct{}
	cancel   context.CancelFunc
	done     chan struct{}
	err      error // why the watch ended; set before done closes
}

// WatchMap reads the partition map and starts watching it. It fails (ErrUnavailable) only if
// the first read fails; afterwards the watch rides out etcd restarts on its own, resuming
// from the last revision it saw, and reads the map afresh if etcd compacted that revision.
func (c *Client) WatchMap(ctx context.Context) (*MapWatcher, error) {
	m, st, err := c.readMapState(ctx)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w := &MapWatcher{c: c, change: make(chan struct{}), progress: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	w.cur.Store(m)
	go w.run(wctx, st, m.Revision)
	return w, nil
}

func (c *Client) readMapState(ctx context.Context) (*Map, *mapState, error) {
	resp, err := c.cli.Get(ctx, c.keys.mapPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, nil, unavailable("read the partition map", err)
	}
	st := &mapState{}
	st.init()
	for _, kv := range resp.Kvs {
		st.put(c.keys, string(kv.Key), kv.Value, kv.CreateRevision, kv.ModRevision)
	}
	return st.snapshot(resp.Header.Revision), st, nil
}

// Map returns the current local copy (never nil). Lock-free, no allocation.
func (w *MapWatcher) Map() *Map { return w.cur.Load() }

// current returns the local copy and the channel closed at its next change, read together.
func (w *MapWatcher) current() (*Map, chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cur.Load(), w.change
}

// WaitRevision waits until the local copy reflects etcd revision rev or later and returns
// it; it fails with ctx's error, or once the watcher is closed. Map changes arrive as
// events; a revision that changed no map key arrives only through a progress notification:
// use Sync for "as current as etcd".
func (w *MapWatcher) WaitRevision(ctx context.Context, rev int64) (*Map, error) {
	for {
		m, ch := w.current()
		if m.Revision >= rev {
			return m, nil
		}
		select {
		case <-ch:
		case <-w.done:
			return nil, fmt.Errorf("cluster: map watcher closed: %w", w.err)
		case <-ctx.Done():
			return nil, fmt.Errorf("cluster: wait for map revision %d (have %d): %w", rev, m.Revision, ctx.Err())
		}
	}
}

// Sync waits until the local copy is as current as etcd was when Sync was called (a
// linearizable read of etcd's revision, then WaitRevision).
func (w *MapWatcher) Sync(ctx context.Context) (*Map, error) {
	resp, err := w.c.cli.Get(ctx, w.c.keys.mapPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return nil, unavailable("sync the partition map", err)
	}
	rev := resp.Header.Revision
	for {
		m, ch := w.current()
		if m.Revision >= rev {
			return m, nil
		}
		// No map change may be coming: have the watch ask etcd how far it is (a progress
		// notification). Asked again after a while, in case one was lost.
		select {
		case w.progress <- struct{}{}:
		default: // a request is pending already
		}
		select {
		case <-ch:
		case <-time.After(500 * time.Millisecond):
		case <-w.done:
			return nil, fmt.Errorf("cluster: map watcher closed: %w", w.err)
		case <-ctx.Done():
			return nil, fmt.Errorf("cluster: sync the partition map to revision %d (have %d): %w", rev, m.Revision, ctx.Err())
		}
	}
}

// Close stops the watch and waits for its goroutine.
func (w *MapWatcher) Close() {
	w.cancel()
	<-w.done
}

func (w *MapWatcher) publish(m *Map) {
	w.mu.Lock()
	w.cur.Store(m)
	close(w.change)
	w.change = make(chan struct{})
	w.mu.Unlock()
}

// run is the watch goroutine: it applies every event batch to st and publishes a snapshot.
func (w *MapWatcher) run(ctx context.Context, st *mapState, rev int64) {
	defer close(w.done)
	k := w.c.keys
	for ctx.Err() == nil {
		wctx := clientv3.WithRequireLeader(ctx)
		wch := w.c.cli.Watch(wctx, k.mapPrefix(), clientv3.WithPrefix(),
			clientv3.WithRev(rev+1), clientv3.WithProgressNotify())
	watching:
		for {
			var resp clientv3.WatchResponse
			select {
			case r, ok := <-wch:
				if !ok {
					break watching
				}
				resp = r
				if h := testhook.MapWatch; h != nil {
					h(w.c)
				}
			case <-w.progress:
				// While this watch is open (its context carries the stream's metadata).
				if ctx.Err() == nil {
					if err := w.c.cli.RequestProgress(wctx); err != nil {
						w.c.log.Warn("cluster: map watch progress request failed", "err", err)
					}
				}
				continue
			}
			if resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted) {
				// Events we needed are gone: read the whole map again.
				if m, nst, err := w.c.readMapState(ctx); err == nil {
					st, rev = nst, m.Revision
					w.publish(m)
				}
				break
			}
			if err := resp.Err(); err != nil {
				break // no leader, or the watch was cancelled: start another
			}
			for _, ev := range resp.Events {
				switch ev.Type {
				case clientv3.EventTypePut:
					st.put(k, string(ev.Kv.Key), ev.Kv.Value, ev.Kv.CreateRevision, ev.Kv.ModRevision)
				case clientv3.EventTypeDelete:
					st.del(k, string(ev.Kv.Key))
				}
			}
			// The snapshot's revision: the last event's, or a progress notification's header
			// revision (etcd sends one only once it has sent every event up to it). Not an
			// event response's header: a watcher catching up may get a batch of events
			// with the current revision in the header and more events still to come.
			r := rev
			if n := len(resp.Events); n > 0 {
				r = resp.Events[n-1].Kv.ModRevision
			} else if resp.IsProgressNotify() {
				r = resp.Header.Revision
			}
			if r > rev {
				rev = r
				w.publish(st.snapshot(rev))
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond): // a pause before watching again, not synchronisation
		}
	}
	w.err = ctx.Err()
}
