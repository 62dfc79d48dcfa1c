package node

import (
	"context"
	"fmt"
	"maps"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/txncoord"
)

// Cache policy per partition. Each owned partition is a table of its storage node's
// transaction node, with its own cache counters and, when pinned, its pages held in that
// transaction node's cache (txnode.Table.Pin) within Config.PinBytes: a game server pins the
// partitions of the zones it serves, so that their reads never miss whatever else it reads.

// Pin pins partitions parts of the table (every partition this node owns when parts is
// empty) in the caches of their storage nodes' transaction nodes: their pages below the
// partition's id high-water mark are fetched and held, and so are the pages the partition
// gains while pinned, within Config.PinBytes per storage node (txnode.Table.Pin:
// txnode.ErrPinBudget beyond it, txnode.ErrCacheFull when the cache cannot make room). A
// partition this node does not own fails with a *NotOwnerError (ErrNotOwner); the partitions
// before a failing one stay pinned. A partition's pin ends with Unpin, or when this node
// loses its grant: when an operation on the partition, a Pin or Stats of the table sees
// it lost (a Pin first releases the pins of lost partitions, so the budget they held is
// its). Any goroutine may call it.
func (t *Table) Pin(ctx context.Context, parts ...uint32) error {
	if err := t.n.closedErr(); err != nil {
		return err
	}
	t.forgetLost() // their pins go first: the budget they held is this Pin's
	if len(parts) == 0 {
		parts = *t.owned.Load()
	}
	for _, p := range parts {
		if p >= uint32(len(t.parts)) {
			return fmt.Errorf("node: %w: table %q has no partition %d", cluster.ErrInvalid, t.m.Name, p)
		}
		tb := t.parts[p].tb.Load()
		if tb == nil {
			return t.notOwner(ctx, p)
		}
		if err := tb.Pin(ctx); err != nil {
			if t.gone(p, err) {
				return t.written(ctx, p, err)
			}
			return fmt.Errorf("node: pin table %q partition %d: %w", t.m.Name, p, t.n.after(err))
		}
	}
	return nil
}

// Unpin releases the pins of partitions parts (every partition when parts is empty); a
// partition not pinned, or not owned, is skipped. Any goroutine may call it.
func (t *Table) Unpin(parts ...uint32) {
	if len(parts) == 0 {
		for p := range t.parts {
			parts = append(parts, uint32(p))
		}
	}
	for _, p := range parts {
		if p < uint32(len(t.parts)) {
			if tb := t.parts[p].tb.Load(); tb != nil {
				tb.Unpin()
			}
		}
	}
}

// PartitionStats are one partition's cache counters on this node.
type PartitionStats struct {
	// Partition is the partition, Node the address of its storage node (the partition map
	// as this handle read it).
	Partition uint32
	Node      string
	// Owned says this node owns the partition: its reads are served by the cache, counted
	// in TableStats (Hits, Misses, HitRate, and the pin: Pinned, PinnedPages, PinnedBytes,
	// PinOverflow). A partition not owned is read from its storage node's durable rows, not
	// cached: its counters are zero.
	Owned bool
	txnode.TableStats
}

// Stats returns the counters of every partition, in partition order: for each owned one its
// cache hits, misses, hit rate and pin since this node took it. A partition whose grant is
// gone is forgotten first (not owned, its pin released). Any goroutine may call it.
func (t *Table) Stats() []PartitionStats {
	t.forgetLost()
	out := make([]PartitionStats, len(t.parts))
	for p := range t.parts {
		out[p] = PartitionStats{Partition: uint32(p), Node: t.parts[p].addr()}
		if tb := t.parts[p].tb.Load(); tb != nil {
			out[p].Owned = true
			out[p].TableStats = tb.Stats()
		}
	}
	return out
}

// forgetLost forgets the owned partitions whose grant is gone for good (their tables'
// Serving says so: the session ended, the lease expired, the owner key went, the storage
// node fenced the grant), as an operation on them would: their pins are released.
func (t *Table) forgetLost() {
	for p := range t.parts {
		if tb := t.parts[p].tb.Load(); tb != nil && isLost(txncoord.Serving(tb)) {
			t.drop(uint32(p))
		}
	}
}

// StoreStats returns the counters (txnode.Stats: cache bytes, pinned bytes, commits, ...)
// of the transaction node of each storage node this node has dialled, by address.
func (n *Node) StoreStats() map[string]txnode.Stats {
	n.mu.Lock()
	conns := maps.Clone(n.dbs)
	n.mu.Unlock()
	out := make(map[string]txnode.Stats, len(conns))
	for addr, sc := range conns {
		select {
		case <-sc.ready:
			if sc.db != nil {
				out[addr] = sc.db.Stats()
			}
		default: // still dialling
		}
	}
	return out
}
