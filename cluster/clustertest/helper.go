//go:build unix

package clustertest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/internal/testhook"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/cluster/proctest"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
	"github.com/weftdb/weft/txnode"
)

// HelperProcess is the body of a package's TestHelperProcess (HelperTest): in a child
// started by this harness it runs the child's role (a storage node, a cluster node's
// workload) until its stdin closes; anywhere else it skips.
func HelperProcess(t *testing.T) {
	role, spec, ok := strings.Cut(os.Getenv(roleEnv), " ")
	if !ok {
		t.Skip("a helper process of package clustertest only")
	}
	var err error
	switch role {
	case "storage":
		var s storageSpec
		if err = json.Unmarshal([]byte(spec), &s); err == nil {
			err = runStorage(s)
		}
	case "node":
		var s nodeSpec
		if err = json.Unmarshal([]byte(spec), &s); err == nil {
			err = runNode(s)
		}
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "clustertest child (%s): %v\n", role, err)
		os.Exit(1)
	}
}

// runStorage serves a storage node as cmd/storenode -etcd does, until stdin closes; it
// answers the txncounts command (StorageNode.TxnCounts) meanwhile.
func runStorage(s storageSpec) error {
	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	cli, err := cluster.Connect(cctx, cluster.Config{Endpoints: s.Etcd, Prefix: s.Prefix, Logger: Quiet})
	ccancel()
	if err != nil {
		return err
	}
	defer cli.Close()
	srv, err := server.New(server.Config{
		Listen: s.Listen, Logger: Quiet, EventLoops: 1,
		Secret: []byte(s.Secret), PeerSecret: []byte(s.PeerSecret), OperatorSecret: []byte(s.OperatorSecret),
		Options: storenode.Options{
			Dir: s.Dir, Sync: storenode.SyncNone, CacheBytes: 4 << 20, CheckpointWALBytes: 1 << 20,
			LeaseDuration:      s.LeaseDuration,
			GrantVerifier:      cluster.NewGrantVerifier(cli, storenode.ErrFenced),
			GrantVerifyTimeout: s.GrantVerifyTimeout,
			LeaseChecker:       cli,
			TxnPeer:            server.NewTxnPeer(server.PeerConfig{Secret: []byte(s.PeerSecret), Name: "clustertest-resolver", Directory: cli}),
			TxnResolveInterval: s.TxnResolveInterval,
			TxnResolveAfter:    s.TxnResolveAfter,
			Logger:             Quiet,
		},
		OnListen: func(a net.Addr) { proctest.Printf("listening %s", a) },
	})
	if err != nil {
		return err
	}
	if err := srv.Start(); err != nil {
		return err
	}
	in := proctest.ChildInput()
	var failed error
loop:
	for {
		select {
		case cmd, ok := <-in:
			if !ok {
				break loop
			}
			if cmd == txnCountsCmd {
				parts, decisions := srv.Engine().TxnCounts()
				proctest.Printf("%s %d %d", txnCountsCmd, parts, decisions)
			}
		case <-srv.Failed():
			failed = srv.Healthy()
			break loop
		}
	}
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	return errors.Join(failed, srv.Shutdown(sctx))
}

// Class names an error of a workload's write for the parent: the first of fenced (the
// storage node refused the grant), notowner (node.ErrNotOwner), expired
// (txnode.ErrLeaseExpired: the grant's check failed locally), lapsed, lost, unavailable
// (cluster's), unverified (the storage node could not reach etcd), timeout (the operation's
// context), closed, other.
func Class(err error) string {
	switch {
	case errors.Is(err, storenode.ErrFenced):
		return "fenced"
	case errors.Is(err, node.ErrNotOwner):
		return "notowner"
	case errors.Is(err, txnode.ErrLeaseExpired):
		return "expired"
	case errors.Is(err, cluster.ErrLapsed):
		return "lapsed"
	case errors.Is(err, cluster.ErrLost):
		return "lost"
	case errors.Is(err, cluster.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, storenode.ErrGrantUnverified):
		return "unverified"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, node.ErrClosed), errors.Is(err, txnode.ErrClosed):
		return "closed"
	}
	return "other"
}

// FencedClasses are the classes of a write refused for want of a provable grant.
var FencedClasses = []string{"fenced", "notowner", "expired", "lapsed", "lost"}

// child is a running cluster-node workload.
type child struct {
	s    nodeSpec
	n    *node.Node
	tbl  *node.Table
	logT *node.Table
	in   <-chan string
	stop bool
	// failures counts the failures in a row: at reopenAfter a Reown node reopens (a
	// transaction node whose storage node stayed unreachable past its RequestTimeout fails
	// every call for good).
	failures int
	// clock is the sessions' lease clock (NodeSpec.BlindClock), nil for the system's.
	clock cluster.Clock
	// killAt is the coordinator's step at which the process kills itself (NodeProc.KillAt),
	// nil when none: set by the workload's goroutine, read by the coordinator's.
	killAt atomic.Pointer[coordStep]
}

// coordStep is a step of the two-phase commit's coordinator (testhook.CoordStep).
type coordStep struct {
	step string
	i    int
}

// killCmd is the cluster-node child's command "kill-at STEP I" (NodeProc.KillAt).
const killCmd = "kill-at"

// coordHook is the child's testhook.CoordStep: at the step armed (killAt) it prints
// "kill STEP I" and kills its own process with SIGKILL: the coordinator crashes there,
// nothing flushed, nothing closed.
func (c *child) coordHook(step string, i int) {
	if k := c.killAt.Load(); k != nil && k.step == step && k.i == i {
		proctest.Printf("kill %s %d", step, i)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}

const reopenAfter = 100

func runNode(s nodeSpec) error {
	if s.TTL == 0 {
		s.TTL = cluster.TTLMin
	}
	if s.Pace == 0 {
		s.Pace = 5 * time.Millisecond
	}
	c := &child{s: s, in: proctest.ChildInput()}
	hook := c.coordHook
	testhook.CoordStep.Store(&hook) // before any transaction
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if s.BlindClock {
		c.clock = newBlindClock(ctx)
	}
	if err := c.open(ctx); err != nil {
		return err
	}
	proctest.Printf("ready %d", c.n.Session().Lease())
	var err error
	switch s.Workload {
	case WorkloadCounter:
		err = c.counter(ctx)
	case WorkloadBank:
		err = c.bank(ctx)
	default:
		err = fmt.Errorf("unknown workload %q", s.Workload)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	c.n.Close(cctx)
	return err
}

// open opens the node and takes the partitions (OwnWait), retrying while etcd is away.
func (c *child) open(ctx context.Context) error {
	var last error
	for ctx.Err() == nil {
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		last = c.tryOpen(octx)
		cancel()
		if last == nil {
			return nil
		}
		if !c.pause(ctx, 20*c.s.Pace) {
			return nil
		}
	}
	return fmt.Errorf("open: %w (last: %w)", ctx.Err(), last)
}

func (c *child) tryOpen(ctx context.Context) error {
	if c.n != nil {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c.n.Close(cctx)
		cancel()
		c.n = nil
	}
	sc := cluster.SessionConfig{Owner: c.s.Owner, Addr: c.s.Addr, TTL: c.s.TTL}
	if c.clock != nil {
		sc.Clock = c.clock
	}
	n, err := node.Open(ctx, node.Config{Logger: Quiet, Secret: []byte(c.s.Secret), OperatorSecret: []byte(c.s.OperatorSecret), CacheBytes: 1 << 20,
		RequestTimeout:     30 * time.Second, // a storage node restarted within it is redialled, its batches resent
		OwnerLookupTimeout: c.s.OwnerLookupTimeout,
		Etcd:               cluster.Config{Endpoints: c.s.Etcd, Prefix: c.s.Prefix, Logger: Quiet},
		Session:            sc})
	if err != nil {
		return err
	}
	c.n = n
	if c.tbl, err = n.OpenTable(ctx, c.s.Table); err != nil {
		return err
	}
	if err = c.tbl.OwnWait(ctx, c.s.Parts...); err != nil {
		return err
	}
	if c.s.LogTable != "" {
		if c.logT, err = n.OpenTable(ctx, c.s.LogTable); err != nil {
			return err
		}
		if err = c.logT.OwnWait(ctx, c.s.Parts...); err != nil {
			return err
		}
	}
	return nil
}

// pause waits d, answering "mark" commands meanwhile; false once stdin closed (stop).
func (c *child) pause(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d) // the workload's pace, not synchronisation
	defer timer.Stop()
	for {
		select {
		case cmd, ok := <-c.in:
			if !ok {
				c.stop = true
				return false
			}
			if cmd == "mark" {
				proctest.Printf("mark")
			}
			var k coordStep
			if _, err := fmt.Sscanf(cmd, killCmd+" %s %d", &k.step, &k.i); err == nil {
				c.killAt.Store(&k)
			}
		case <-timer.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
}

// after paces the loop after an operation and reopens the node after a lost grant (Reown);
// false once the workload must stop.
func (c *child) after(ctx context.Context, err error) bool {
	if err == nil {
		c.failures = 0
		return c.pause(ctx, c.s.Pace)
	}
	c.failures++
	if !c.pause(ctx, 4*c.s.Pace) {
		return false
	}
	if c.s.Reown && (errors.Is(err, node.ErrNotOwner) || errors.Is(err, cluster.ErrLost) || c.failures >= reopenAfter) {
		c.failures = 0
		if err := c.open(ctx); err != nil || c.stop {
			return false
		}
		proctest.Printf("reopen %d", c.n.Session().Lease())
	}
	return true
}

// blindClock is NodeSpec.BlindClock's lease clock: it advances as the monotonic clock
// does, but by at most blindStep between two readings, and a goroutine reads it every
// blindTick while the process runs; so a SIGSTOP, however long, moves it by blindStep at
// most. Any goroutine.
type blindClock struct {
	mu         sync.Mutex
	real, virt time.Time
}

const blindStep, blindTick = 100 * time.Millisecond, 10 * time.Millisecond

func newBlindClock(ctx context.Context) *blindClock {
	now := time.Now()
	c := &blindClock{real: now, virt: now}
	go func() {
		tick := time.NewTicker(blindTick)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				c.Now()
			}
		}
	}()
	return c
}

// Now implements cluster.Clock.
func (c *blindClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	c.virt = c.virt.Add(min(now.Sub(c.real), blindStep))
	c.real = now
	return c.virt
}

func le(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }

func row(b []byte, vs ...uint64) []byte {
	clear(b)
	for i, v := range vs {
		binary.LittleEndian.PutUint64(b[8*i:], v)
	}
	return b
}

func (c *child) counter(ctx context.Context) error {
	counters := map[uint32]uint64{}
	for _, id := range c.s.Rows {
		counters[c.tbl.Partition(id)] = id
	}
	for i := 0; ; i++ {
		p := c.s.Parts[i%len(c.s.Parts)]
		id, ok := counters[p]
		if !ok {
			return fmt.Errorf("no counter row for partition %d", p)
		}
		proctest.Printf("try %d", p)
		var v uint64
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := c.tbl.Update(octx, id, func(r []byte) error {
			v = le(r) + 1
			row(r, v)
			return nil
		})
		cancel()
		if err != nil {
			proctest.Printf("err %d %s %s", p, Class(err), oneLine(err))
		} else {
			proctest.Printf("ok %d %d", p, v)
		}
		if !c.after(ctx, err) {
			return nil
		}
	}
}

// BankPairs reports whether a transfer between accounts a and b is allowed: today both on
// one storage node (node.Update commits on one storage node), any two with crossNode
// (two-phase commit across storage nodes). The one switch of the bank's pairing.
func BankPairs(t *node.Table, a, b uint64, crossNode bool) bool {
	return a != b && (crossNode || t.NodeOf(a) == t.NodeOf(b))
}

// Log rows of the bank: from, to, amount moved, owner, seq.

func (c *child) bank(ctx context.Context) error {
	var accts []uint64
	for _, id := range c.s.Rows {
		for _, p := range c.s.Parts {
			if c.tbl.Partition(id) == p {
				accts = append(accts, id)
			}
		}
	}
	if len(accts) < 2 {
		return fmt.Errorf("bank: %d accounts in the owned partitions", len(accts))
	}
	rng := rand.New(rand.NewPCG(c.s.Seed, c.s.Owner))
	a, b, lr := make([]byte, c.tbl.RowBytes()), make([]byte, c.tbl.RowBytes()), make([]byte, c.logT.RowBytes())
	for seq := uint64(1); ; {
		from, to := accts[rng.IntN(len(accts))], accts[rng.IntN(len(accts))]
		if !BankPairs(c.tbl, from, to, c.s.CrossNode) {
			continue
		}
		amount := uint64(1 + rng.IntN(9))
		proctest.Printf("try %d %d %d %d", seq, from, to, amount)
		logID := "-"
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := c.n.Update(octx, func(tx *node.Tx) error {
			logID = "-"
			if err := tx.Get(c.tbl, from, a); err != nil {
				return err
			}
			if err := tx.Get(c.tbl, to, b); err != nil {
				return err
			}
			moved := min(amount, le(a))
			if err := tx.Put(c.tbl, from, row(a, le(a)-moved)); err != nil {
				return err
			}
			if err := tx.Put(c.tbl, to, row(b, le(b)+moved)); err != nil {
				return err
			}
			id, err := tx.Insert(c.logT, row(lr, from, to, moved, c.s.Owner, seq))
			if err == nil {
				logID = strconv.FormatUint(id, 10)
				proctest.Printf("log %d %s", seq, logID)
			}
			return err
		})
		cancel()
		if err != nil {
			proctest.Printf("err %d %s %s %s", seq, logID, Class(err), oneLine(err))
		} else {
			proctest.Printf("ok %d %s", seq, logID)
		}
		seq++
		if !c.after(ctx, err) {
			return nil
		}
	}
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", " ") }
