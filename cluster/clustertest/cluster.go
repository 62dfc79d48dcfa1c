//go:build unix

package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/etcdtest"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/cluster/proctest"
	"github.com/weftdb/weft/sgio"
)

// HelperTest is the helper test every package using this harness defines, one line:
//
//	func TestHelperProcess(t *testing.T) { clustertest.HelperProcess(t) }
//
// Every child (storage node or cluster node) re-executes the test binary with
// -test.run=^TestHelperProcess$.
const HelperTest = "TestHelperProcess"

// roleEnv carries a child's role and spec (JSON) to HelperProcess.
const roleEnv = "WEFT_CLUSTERTEST_CHILD"

// Options shape a cluster. Zero values take the defaults.
type Options struct {
	// StorageNodes is the number of storage-node processes (3 when zero).
	StorageNodes int
	// Prefix is the cluster's etcd prefix (a fresh one per cluster when empty).
	Prefix string
	// LeaseDuration is each storage node's lease (storenode.Options.LeaseDuration), 2 s when
	// zero: a transaction node re-registers its etcd grants every quarter of it.
	LeaseDuration time.Duration
	// TxnResolveInterval is each storage node's in-doubt resolver period (200 ms when zero).
	TxnResolveInterval time.Duration
	// TxnResolveAfter is how long a prepared part waits for its coordinator before the
	// resolver asks its primary (storenode.Options.TxnResolveAfter; its default when zero).
	TxnResolveAfter time.Duration
	// GrantVerifyTimeout bounds each storage node's etcd grant verification (2 s when zero).
	GrantVerifyTimeout time.Duration
}

// Cluster is a test's cluster: an embedded etcd (behind its proxy: Etcd.Stop, Restart and
// Cut take it away from every node and give it back), storage nodes as child processes, an
// etcd client for the test, and the cluster's three secrets (docs/operations.md, "Roles and
// credentials"). Its methods: the test's goroutine.
type Cluster struct {
	t      testing.TB
	Etcd   *etcdtest.Server
	Prefix string
	// Secret is the clients' (the game servers'), PeerSecret the storage nodes' own (their
	// resolvers'), OperatorSecret the operators' (moves, backups).
	Secret         []byte
	PeerSecret     []byte
	OperatorSecret []byte
	Client         *cluster.Client
	Storage        []*StorageNode
	opts           Options
}

var prefixSeq atomic.Int64

// Start starts etcd and the storage nodes, each in its own directory under t.TempDir(), on a
// 127.0.0.1 port kept across restarts, verifying etcd grants as cmd/storenode -etcd does
// (cluster.GrantVerifier, the Client as the lease checker of the two-phase commit's
// resolver, a TxnPeer with the cluster's secret). Everything stops at the test's end.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.StorageNodes == 0 {
		opts.StorageNodes = 3
	}
	if opts.Prefix == "" {
		opts.Prefix = fmt.Sprintf("/clustertest-%d/", prefixSeq.Add(1))
	}
	if opts.LeaseDuration == 0 {
		opts.LeaseDuration = 2 * time.Second
	}
	if opts.TxnResolveInterval == 0 {
		opts.TxnResolveInterval = 200 * time.Millisecond
	}
	if opts.GrantVerifyTimeout == 0 {
		opts.GrantVerifyTimeout = 2 * time.Second
	}
	c := &Cluster{t: t, Etcd: etcdtest.Start(t), Prefix: opts.Prefix, opts: opts,
		Secret: []byte(sgio.GenerateSecret()), PeerSecret: []byte(sgio.GenerateSecret()), OperatorSecret: []byte(sgio.GenerateSecret())}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli, err := cluster.Connect(ctx, cluster.Config{Endpoints: c.Etcd.Endpoints(), Prefix: c.Prefix, Logger: Quiet})
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	c.Client = cli
	for i := range opts.StorageNodes {
		c.Storage = append(c.Storage, c.startStorage(i))
	}
	return c
}

// Quiet is the harness's logger: it drops everything (the failures under test are expected).
var Quiet = slog.New(slog.DiscardHandler)

// Addrs returns the storage nodes' addresses, in order.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Storage))
	for i, s := range c.Storage {
		out[i] = s.Addr
	}
	return out
}

// StorageOf returns the storage node at addr (nil if none).
func (c *Cluster) StorageOf(addr string) *StorageNode {
	for _, s := range c.Storage {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// StorageNode is one storage-node child process.
type StorageNode struct {
	*proctest.Proc
	t     testing.TB
	Index int
	Dir   string
	Addr  string
}

// storageSpec is a storage-node child's configuration (roleEnv, role "storage").
type storageSpec struct {
	Dir, Listen        string
	Etcd               []string
	Prefix             string
	Secret             string
	PeerSecret         string
	OperatorSecret     string
	LeaseDuration      time.Duration
	TxnResolveInterval time.Duration
	TxnResolveAfter    time.Duration
	GrantVerifyTimeout time.Duration
}

func (c *Cluster) startStorage(i int) *StorageNode {
	c.t.Helper()
	dir := c.t.TempDir()
	var (
		proc *proctest.Proc
		addr string
	)
	// The port is picked by listening on :0 and closing: another process may take it before
	// the child binds it, hence the retries (a failed child exits before its ready line).
	for try := 0; ; try++ {
		addr = freeAddr(c.t)
		spec := storageSpec{Dir: dir, Listen: addr, Etcd: c.Etcd.Endpoints(), Prefix: c.Prefix, Secret: string(c.Secret),
			PeerSecret: string(c.PeerSecret), OperatorSecret: string(c.OperatorSecret),
			LeaseDuration: c.opts.LeaseDuration, TxnResolveInterval: c.opts.TxnResolveInterval, TxnResolveAfter: c.opts.TxnResolveAfter,
			GrantVerifyTimeout: c.opts.GrantVerifyTimeout}
		ps := proctest.Spec{Name: fmt.Sprintf("storage node %d", i), Test: HelperTest,
			Env: []string{roleEnv + "=storage " + mustJSON(spec)}, Ready: "listening "}
		var err error
		proc, err = proctest.TryStart(c.t, ps)
		if err == nil {
			break
		}
		if try == 4 {
			c.t.Fatalf("clustertest: storage node %d: %v", i, err)
		}
	}
	return &StorageNode{Proc: proc, t: c.t, Index: i, Dir: dir, Addr: addr}
}

// TxnCounts asks the running storage node for its two-phase commit state
// (storenode.Engine.TxnCounts): the parts it keeps (prepared, or applied and not yet
// reported to their primary) and the decisions it keeps as a primary. Both zero: nothing in
// doubt there. Only the test's goroutine, while the node runs (it reads the node's stdout).
func (s *StorageNode) TxnCounts(ctx context.Context) (parts, decisions int) {
	l := s.Ask(ctx, txnCountsCmd)
	_, err := fmt.Sscanf(l, txnCountsCmd+" %d %d", &parts, &decisions)
	if err != nil {
		s.t.Fatalf("clustertest: storage node %d: %q: %v", s.Index, l, err)
	}
	return parts, decisions
}

// txnCountsCmd is the storage-node child's one command (TxnCounts), answered on stdout with
// "txncounts PARTS DECISIONS".
const txnCountsCmd = "txncounts"

func freeAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// OpenNode opens an in-process cluster node (owner id owner, taking requests at addr) of the
// cluster, with a session of cluster.TTLMin and a 1 MiB cache; closed at the test's end.
func (c *Cluster) OpenNode(owner uint64, addr string) *node.Node {
	c.t.Helper()
	return c.OpenNodeWith(owner, addr, node.Config{})
}

// OpenNodeWith is OpenNode with cfg's own settings (timeouts, durability, flush interval; its
// Logger, or Quiet when nil); the cluster's secrets, etcd, session and cache replace cfg's.
func (c *Cluster) OpenNodeWith(owner uint64, addr string, cfg node.Config) *node.Node {
	c.t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = Quiet
	}
	cfg.Secret, cfg.OperatorSecret, cfg.CacheBytes = c.Secret, c.OperatorSecret, 1<<20
	cfg.Etcd = cluster.Config{Endpoints: c.Etcd.Endpoints(), Prefix: c.Prefix, Logger: Quiet}
	cfg.Session = cluster.SessionConfig{Owner: owner, Addr: addr, TTL: cluster.TTLMin}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := node.Open(ctx, cfg)
	require.NoError(c.t, err)
	c.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n.Close(ctx)
	})
	return n
}

// NodeSpec is a cluster-node child's workload (StartNode).
type NodeSpec struct {
	// Owner is the node's owner id; Addr where it takes requests (its NotOwnerErrors name it).
	Owner uint64
	Addr  string
	// TTL is its session's lease TTL (cluster.TTLMin when zero).
	TTL time.Duration
	// Workload is WorkloadCounter or WorkloadBank.
	Workload string
	// Table is the table the workload writes (the bank's accounts); Parts the partitions the
	// node owns (OwnWait: it waits out a holder).
	Table string
	Parts []uint32
	// Rows are the rows the workload writes: the counter workload's counter of each owned
	// partition (one each), the bank's accounts (those of owned partitions are used).
	Rows []uint64
	// LogTable is the bank's transfer log (a table of the same layout; the node owns the
	// same partitions of it).
	LogTable string
	// CrossNode lets the bank pair accounts on different storage nodes (two-phase commit);
	// off: both accounts of a transfer are on one storage node (BankPairs).
	CrossNode bool
	// Reown makes the node reopen (a new session) and take its partitions again (OwnWait)
	// when a write finds its grant lost, printing "reopen"; off: it goes on trying and
	// failing.
	Reown bool
	// Pace is the pause after each operation (5 ms when zero), and after a failure four
	// times it: the workload's rate on a shared 2-core machine, not synchronisation.
	Pace time.Duration
	// Seed seeds the bank's choices.
	Seed uint64
	// BlindClock gives the node's session a lease clock that does not see the process
	// stopped (at most 100 ms pass on it across a SIGSTOP, however long): the monotonic clock
	// of a suspended VM. Resumed, the node believes its lease has the time left it had when it
	// stopped, so its own lease check lets its writes go out: only the storage nodes' fencing
	// stops them.
	BlindClock bool
	// OwnEtcdLink puts a proxy of its own between the node and etcd (NodeProc.EtcdLink), which
	// the test can cut from this node alone: a resumed node that cannot hear from etcd that its
	// lease expired and its partitions were taken.
	OwnEtcdLink bool
	// OwnerLookupTimeout is node.Config.OwnerLookupTimeout (its default when zero): how long a
	// refused write waits for etcd to name the partition's holder.
	OwnerLookupTimeout time.Duration
}

// Workloads of a cluster-node child.
const (
	// WorkloadCounter increments the counter of each owned partition in turn (Table.Update:
	// read, +1, write), printing "try P" before and "ok P V" (the value it wrote) or
	// "err P CLASS MESSAGE" after.
	WorkloadCounter = "counter"
	// WorkloadBank moves money between pairs of its accounts (Node.Update), each transfer
	// with a log row in LogTable, printing "try SEQ FROM TO AMOUNT" before,
	// "log SEQ LOGID" in each run of the transaction once its log row is inserted (the last
	// one is the transfer's, even if the process dies before the answer), and
	// "ok SEQ LOGID" or "err SEQ LOGID CLASS MESSAGE" after (LOGID: the log row's id of
	// the last run of the transaction, "-" if none).
	WorkloadBank = "bank"
)

// NodeProc is a cluster-node child process.
type NodeProc struct {
	*proctest.Proc
	Spec NodeSpec
	// EtcdLink is the node's own proxy to etcd (NodeSpec.OwnEtcdLink; nil otherwise): Cut it
	// to take etcd away from this node alone.
	EtcdLink *etcdtest.Proxy
}

// nodeSpec is a cluster-node child's configuration (roleEnv, role "node").
type nodeSpec struct {
	NodeSpec
	Etcd           []string
	Prefix         string
	Secret         string
	OperatorSecret string
}

// StartNode starts a cluster-node child running spec's workload and waits for its "ready"
// line (printed once it owns its partitions; it carries "ready LEASE", the session's lease
// id). It runs until its stdin closes (CloseInput: it stops, closes the node and exits) or it
// is killed. Its stdout lines are the workload's (NodeSpec's workloads), "reopen LEASE"
// after a reopen, "mark" in answer to a "mark" on its stdin, and "kill STEP I" just before
// it kills itself at a step of the two-phase commit (KillAt).
func (c *Cluster) StartNode(spec NodeSpec) *NodeProc {
	c.t.Helper()
	ns := nodeSpec{NodeSpec: spec, Etcd: c.Etcd.Endpoints(), Prefix: c.Prefix, Secret: string(c.Secret), OperatorSecret: string(c.OperatorSecret)}
	var link *etcdtest.Proxy
	if spec.OwnEtcdLink {
		var err error
		link, err = etcdtest.NewProxy(c.Etcd.Addr())
		require.NoError(c.t, err)
		c.t.Cleanup(link.Close) // after the child's kill (cleanups run last first)
		ns.Etcd = []string{link.Endpoint()}
	}
	p := proctest.Start(c.t, proctest.Spec{Name: fmt.Sprintf("cluster node %x", spec.Owner), Test: HelperTest,
		Env: []string{roleEnv + "=node " + mustJSON(ns)}, Ready: "ready"})
	return &NodeProc{Proc: p, Spec: spec, EtcdLink: link}
}

// KillAt arms the child's coordinator crash: at the next time its two-phase commit reaches
// step with i (testhook.CoordStep's steps: "prepared" after i prepares answered,
// "prepared-all", "decided" with i 0, "applied" after i applies answered), the child prints
// "kill STEP I" and kills itself with SIGKILL. The command is read between two operations.
func (p *NodeProc) KillAt(step string, i int) error {
	return p.Send(fmt.Sprintf("%s %s %d", killCmd, step, i))
}

// FenceProbe registers, on the storage node at addr, an etcd grant of owner for partition
// part of table at epoch, over a connection of its own, and returns the storage node's
// answer: storenode.ErrFenced (sgio.ErrFenced) for a grant that is not the partition's
// current one. It does not touch the rows.
func (c *Cluster) FenceProbe(ctx context.Context, addr, table string, part uint32, owner, epoch uint64) error {
	cl, err := sgio.Dial(ctx, sgio.ClientConfig{Addr: addr, Secret: c.Secret, OwnerID: owner, Name: "fence-probe"})
	if err != nil {
		return fmt.Errorf("clustertest: dial %s: %w", addr, err)
	}
	defer cl.Close()
	var ti sgio.TableInfo
	if err := cl.CallInto(ctx, &sgio.OpenTable{Name: base.PartitionTableName(table, part)}, &ti); err != nil {
		return fmt.Errorf("clustertest: open %s on %s: %w", base.PartitionTableName(table, part), addr, err)
	}
	return cl.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Flags: sgio.AcquireEtcdGrant, Owner: owner, Epoch: epoch}, &sgio.Grant{})
}

// Fields splits a child's line into its words.
func Fields(line string) []string { return strings.Fields(line) }
