package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/weftdb/weft/storenode"
)

// Which addresses the two-phase commit's resolver may dial (docs/cluster.md, "Peers"). A
// TxnPrepare names its primary, and the resolver dials it with the peers' secret: a client
// naming a listener of its own could relay that handshake back to this node and hold a
// session authenticated as a peer (issue 22, review defect 1). So the resolver dials only
// the cluster's storage nodes, and a prepare naming another primary is refused.
//
// Invariants:
//   - Peer dials an address only when it is in PeerConfig.Peers or in the Directory's
//     latest list; with neither configured it dials nobody (parts whose primary is another
//     node stay in doubt for their coordinator or an operator, weft txn);
//   - the Directory is read when the list is older than peerDirectoryTTL or lacks the
//     address, at most once per peerDirectoryMissEvery (a client naming made-up primaries
//     cannot load etcd), one read at a time, each bounded by peerDirectoryReadTimeout; a
//     failed read keeps the last list (a storage node known stays known while etcd is away);
//   - an address the list lacks, read less than peerDirectoryMissEvery ago, waits for the
//     next read (once, within its context; the lock not held): a list read just before a
//     partition moved to a storage node that held none would otherwise refuse, for up to
//     peerDirectoryMissEvery, every prepare naming it as primary.

// PeerDirectory lists the addresses of the cluster's storage nodes: in cluster mode the
// partition map's (cluster.Client.StorageNodes). Any goroutine may call it.
type PeerDirectory interface {
	StorageNodes(ctx context.Context) ([]string, error)
}

const (
	// peerDirectoryTTL is how long a list read from the Directory is used as is.
	peerDirectoryTTL = 5 * time.Second
	// peerDirectoryMissEvery is how often, at most, an address not in the list makes the
	// Peer read the Directory again (a storage node just added to the map).
	peerDirectoryMissEvery = 500 * time.Millisecond
	// peerDirectoryReadTimeout bounds one read of the Directory.
	peerDirectoryReadTimeout = 5 * time.Second
)

// ErrUnknownPrimary is returned for a primary that is not one of the cluster's storage
// nodes: by a TxnPrepare naming it (over the wire as sgio's Malformed, which it matches),
// and by the resolver's calls, which never dial it.
var ErrUnknownPrimary = &sentinel{msg: "storenode: the primary is not a storage node of the cluster", parent: storenode.ErrMalformed}

// peerDirectory is a Peer's view of which addresses it may dial.
type peerDirectory struct {
	static map[string]bool
	dir    PeerDirectory
	now    func() time.Time
	after  func(time.Duration) <-chan time.Time

	mu      sync.Mutex // held during a read of dir: one at a time
	known   map[string]bool
	readAt  time.Time // the last successful read
	triedAt time.Time // the last read attempt
	readOK  bool
}

func newPeerDirectory(cfg *PeerConfig) *peerDirectory {
	d := &peerDirectory{static: make(map[string]bool, len(cfg.Peers)), dir: cfg.Directory, now: cfg.Now, after: cfg.After}
	if d.now == nil {
		d.now = time.Now
	}
	if d.after == nil {
		d.after = time.After
	}
	for _, a := range cfg.Peers {
		d.static[a] = true
	}
	return d
}

// configured reports whether any address may be dialed at all.
func (d *peerDirectory) configured() bool { return len(d.static) > 0 || d.dir != nil }

// check returns nil when addr is a storage node of the cluster, else an error wrapping
// ErrUnknownPrimary (or, when the Directory was never read, its error).
func (d *peerDirectory) check(ctx context.Context, addr string) error {
	if d.static[addr] {
		return nil
	}
	if d.dir == nil {
		if len(d.static) == 0 {
			return fmt.Errorf("%w: %s (no storage node is configured: PeerConfig.Peers, -peers, or etcd)", ErrUnknownPrimary, addr)
		}
		return fmt.Errorf("%w: %s is not in PeerConfig.Peers (-peers)", ErrUnknownPrimary, addr)
	}
	for waited := false; ; waited = true {
		in, readOK, wait, err := d.lookup(ctx, addr)
		switch {
		case in:
			return nil
		case !readOK && err != nil:
			return fmt.Errorf("storenode: primary %s: the list of storage nodes: %w", addr, err)
		case wait > 0 && !waited && ctx.Err() == nil:
			select {
			case <-d.after(wait):
				continue // the list read afresh: addr may have joined since the last read
			case <-ctx.Done():
			}
		}
		return fmt.Errorf("%w: %s is not in the partition map's storage nodes", ErrUnknownPrimary, addr)
	}
}

// lookup reports whether addr is in the list, reading the Directory first when the list is
// stale or lacks addr and the last read is not too recent; wait is how long until the next
// read is allowed (0 when this lookup read, or may). Under mu.
func (d *peerDirectory) lookup(ctx context.Context, addr string) (in, readOK bool, wait time.Duration, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	in = d.known[addr]
	stale := !d.readOK || now.Sub(d.readAt) >= peerDirectoryTTL
	if in && !stale {
		return true, true, 0, nil
	}
	if !d.triedAt.IsZero() && now.Sub(d.triedAt) < peerDirectoryMissEvery {
		return in, d.readOK, d.triedAt.Add(peerDirectoryMissEvery).Sub(now), nil
	}
	err = d.read(ctx, now)
	return d.known[addr], d.readOK, 0, err
}

// read reads the Directory (under mu); a failure keeps the last list.
func (d *peerDirectory) read(ctx context.Context, now time.Time) error {
	d.triedAt = now
	ctx, cancel := context.WithTimeout(ctx, peerDirectoryReadTimeout)
	defer cancel()
	nodes, err := d.dir.StorageNodes(ctx)
	if err != nil {
		return err
	}
	known := make(map[string]bool, len(nodes))
	for _, a := range nodes {
		known[a] = true
	}
	d.known, d.readAt, d.readOK = known, now, true
	return nil
}
