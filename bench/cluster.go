package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/sgio"
)

// --cluster N runs the workloads through a cluster node (package cluster/node) over N
// storage node children (this binary again, as --spawn-store starts one, each verifying
// grants in etcd as cmd/storenode -etcd does) and an etcd member inside this process. Each
// backend opened (one per cache size) is a node.Node of its own with a new table of
// N*clusterPartitionsPerNode partitions, partition p on storage node p%N, every partition
// owned by the node: each op is a transaction on one storage node, routed by the row's id.
//
// Ids: the node's inserts go round robin over its partitions and each partition takes its
// ids from its own stripes, so the loaded ids are not first..first+Records-1. The backend
// translates instead: Load returns clusterLogicalBase as the first id, loads the i-th row
// with the content of row clusterLogicalBase+i, and keeps its real id in ids[i]; Get and
// Update map a logical id in clusterLogicalBase..+Records-1 to ids[i-base] (one load from an
// 8-byte-per-row array: 2.4 MB at 300k rows, a likely cache miss per op at 30M rows, a few
// ns against the op's tens of us) and pass any other id (an inserted row's, which is below
// 2^62) through as it is.

// clusterPartitionsPerNode is k in partitions = N*k.
const clusterPartitionsPerNode = 4

// clusterStripePages is the tables' stripe: one 64-row page, the finest spread.
const clusterStripePages = 1

// clusterLogicalBase is the first logical id of the loaded rows; real ids are below it.
const clusterLogicalBase = uint64(1) << 62

// clusterDeploy is the running cluster: the etcd member's endpoint and the storage nodes.
type clusterDeploy struct {
	etcd   string
	secret []byte // the clients' secret of the storage nodes (the cluster node's)
	addrs  []string
	pids   []int
	owners *atomic.Uint64 // the next backend's owner id (nonzero, one per node.Node)
}

func clusterFactory(d clusterDeploy) Factory {
	return Factory{
		Name:           WeftEngine,
		CacheSensitive: true,
		Note: fmt.Sprintf("--cluster %d: one cluster node (cluster/node), a table of %d partitions (%d per storage node, %d-page stripes), "+
			"all owned by the node; each op one transaction on one storage node; the cache size is the node's total, split evenly "+
			"over its %d transaction nodes; the hit ratio is from their counters (cluster/node.Node.StoreStats); etcd's CPU counts as this process's",
			len(d.addrs), len(d.addrs)*clusterPartitionsPerNode, clusterPartitionsPerNode, clusterStripePages, len(d.addrs)),
		Open: func(ctx context.Context, cfg OpenConfig) (Backend, error) {
			return openCluster(ctx, cfg, d)
		},
	}
}

// clusterBackend is one node.Node and one partitioned table.
type clusterBackend struct {
	dep clusterDeploy
	n   *node.Node
	t   *node.Table
	ids []uint64 // ids[i] is the real id of logical id clusterLogicalBase+i, set by Load

	walMu    sync.Mutex
	walLast  []uint64 // each storage node's WAL bytes at its last successful stats request
	syncLast []uint64 // and its WAL syncs
}

func openCluster(ctx context.Context, cfg OpenConfig, d clusterDeploy) (_ *clusterBackend, err error) {
	durability, err := parseDurability(cfg.Durability)
	if err != nil {
		return nil, err
	}
	logger := warnLogger()
	owner := d.owners.Add(1)
	n, err := node.Open(ctx, node.Config{
		Etcd:       cluster.Config{Endpoints: []string{d.etcd}, Logger: logger},
		Session:    cluster.SessionConfig{Owner: owner, Addr: fmt.Sprintf("crudbench-%d", owner)},
		Secret:     d.secret,
		CacheBytes: max(cfg.CacheBytes/int64(len(d.addrs)), 1),
		Durability: durability,
		Logger:     logger,
	})
	if err != nil {
		return nil, fmt.Errorf("bench: cluster node: %w", err)
	}
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			n.Close(cctx)
			cancel()
		}
	}()
	parts := len(d.addrs) * clusterPartitionsPerNode
	t, err := n.CreateTable(ctx, fmt.Sprintf("crud%d", owner), cfg.RowBytes, parts, clusterStripePages, d.addrs)
	if err != nil {
		return nil, fmt.Errorf("bench: cluster: %w", err)
	}
	all := make([]uint32, parts)
	for p := range all {
		all[p] = uint32(p)
	}
	if err := t.Own(ctx, all...); err != nil {
		return nil, fmt.Errorf("bench: cluster: own the partitions: %w", err)
	}
	return &clusterBackend{dep: d, n: n, t: t,
		walLast: make([]uint64, len(d.addrs)), syncLast: make([]uint64, len(d.addrs))}, nil
}

// Load inserts the rows from spec.Workers goroutines, one synchronous insert each at a time
// (cluster/node has no asynchronous sessions; concurrent commits still group into batches
// at each transaction node), and records each row's real id.
func (c *clusterBackend) Load(ctx context.Context, spec LoadSpec) (uint64, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	c.ids = make([]uint64, spec.Records)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range spec.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			row := make([]byte, spec.RowBytes)
			done := 0
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(spec.Records) {
					break
				}
				spec.Row(row, clusterLogicalBase+uint64(i))
				id, err := c.t.Insert(ctx, row)
				if err == nil && id >= clusterLogicalBase {
					err = fmt.Errorf("id %d is not below the logical ids (2^62)", id)
				}
				if err != nil {
					cancel(err)
					return
				}
				c.ids[i] = id
				if done++; done == 1024 {
					spec.Progress(done)
					done = 0
				}
			}
			if done > 0 {
				spec.Progress(done)
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return 0, fmt.Errorf("bench: load cluster: %w", err)
	}
	return clusterLogicalBase, nil
}

// real returns the real id of id: a loaded row's logical id translated, any other as it is.
func (c *clusterBackend) real(id uint64) uint64 {
	if i := id - clusterLogicalBase; id >= clusterLogicalBase && i < uint64(len(c.ids)) {
		return c.ids[i]
	}
	return id
}

func (c *clusterBackend) Insert(ctx context.Context, row []byte) (uint64, error) {
	id, err := c.t.Insert(ctx, row)
	if err == nil && id >= clusterLogicalBase {
		return 0, fmt.Errorf("bench: cluster: id %d is not below the logical ids (2^62)", id)
	}
	return id, err
}

func (c *clusterBackend) Get(ctx context.Context, id uint64, dst []byte) error {
	return c.t.Get(ctx, c.real(id), dst)
}

func (c *clusterBackend) Update(ctx context.Context, id uint64, fn func(row []byte) error) error {
	return c.t.Update(ctx, c.real(id), fn)
}

func (c *clusterBackend) Delete(ctx context.Context, id uint64) error {
	return c.t.Delete(ctx, c.real(id))
}

// Stats sums the storage nodes' TCP bytes, WAL counters and CPU time, and the transaction
// nodes' cache misses.
func (c *clusterBackend) Stats() Stats {
	st := Stats{HasCache: true}
	for _, s := range c.n.StoreStats() {
		st.CacheMisses += s.PageMisses
	}
	for i, addr := range c.dep.addrs {
		st.NetBytes += TCPBytes(addr) // before the stats connection opens
		st.ServerCPU += ProcessCPU(c.dep.pids[i])
	}
	st.WALBytes, st.WALSyncs = c.remoteWAL()
	return st
}

// remoteWAL asks every storage node for its WAL counters; a node that does not answer
// counts with its last values.
func (c *clusterBackend) remoteWAL() (bytes, syncs uint64) {
	c.walMu.Lock()
	defer c.walMu.Unlock()
	for i, addr := range c.dep.addrs {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		stats, err := StoreStats(ctx, addr, c.dep.secret)
		cancel()
		if err == nil {
			if v, ok := walBytesStat(stats); ok {
				c.walLast[i] = v
			}
			if v, ok := stats["wal_syncs"]; ok {
				c.syncLast[i] = v
			}
		}
		bytes += c.walLast[i]
		syncs += c.syncLast[i]
	}
	return bytes, syncs
}

// Close closes the node (flushing, releasing its partitions and its session). The table
// stays on the storage nodes (cluster/node has no drop) until they stop at the end of the run.
func (c *clusterBackend) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return c.n.Close(ctx)
}

// startCluster starts the etcd member (data under dir) and n storage node children; stop
// ends them all, also when the start failed midway (it is nil then: startCluster cleaned up).
func startCluster(ctx context.Context, dir string, n int, child storeChildConfig, r *runner) (_ clusterDeploy, stop func() error, err error) {
	e, err := startEtcd(dir)
	if err != nil {
		return clusterDeploy{}, nil, err
	}
	var kids []*spawnedStore
	stop = func() error {
		var errs []error
		for _, k := range kids {
			errs = append(errs, k.stop())
		}
		e.close()
		return errors.Join(errs...)
	}
	defer func() {
		if err != nil {
			stop()
			stop = nil
		}
	}()
	child.Etcd = e.endpoint
	d := clusterDeploy{etcd: e.endpoint, owners: new(atomic.Uint64)}
	// The roles' secrets, as `weft cluster up` makes them: the storage nodes read all three,
	// the cluster node dials with the clients'.
	var secrets [3][]byte
	for i, f := range []*string{&child.SecretFile, &child.PeerSecretFile, &child.OperatorSecretFile} {
		secrets[i] = []byte(sgio.GenerateSecret())
		*f = filepath.Join(dir, fmt.Sprintf("secret-%d", i))
		if err := os.WriteFile(*f, secrets[i], 0o600); err != nil {
			return clusterDeploy{}, nil, fmt.Errorf("bench: cluster: %w", err)
		}
	}
	d.secret = secrets[0]
	for range n {
		k, err := spawnStore(ctx, child, r.stderr)
		if err != nil {
			return clusterDeploy{}, nil, err
		}
		kids = append(kids, k)
		d.addrs = append(d.addrs, k.addr)
		d.pids = append(d.pids, k.cmd.Process.Pid)
		r.logf("spawned storage node (pid %d) at %s", k.cmd.Process.Pid, k.addr)
	}
	return d, stop, nil
}
