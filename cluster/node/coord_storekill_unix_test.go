//go:build unix

package node_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
	"github.com/weftdb/weft/txnode"
)

// storeHelperEnv carries "etcd endpoint|data dir|listen address" to TestHelperStorageNode.
const storeHelperEnv = "WEFT_COORD_STORE_HELPER"

// TestHelperStorageNode is the child of TestStorageNodeKilledDuringCrossNodeTransfers (it
// does nothing unless started by it): a storage node wired for two-phase commit (etcd as
// grant verifier and lease checker, peers), which prints "ready" once it listens and then,
// for each line "resolve" on stdin, runs one resolver pass and prints "parts N" (the parts it
// keeps). It exits when stdin closes.
func TestHelperStorageNode(t *testing.T) {
	spec := os.Getenv(storeHelperEnv)
	if spec == "" {
		t.Skip("helper process only")
	}
	f := strings.Split(spec, "|")
	ctx, cancel := context.WithTimeout(context.Background(), 110*time.Second)
	defer cancel()
	c, err := cluster.Connect(ctx, cluster.Config{Endpoints: []string{f[0]}, Prefix: prefix, Logger: quiet})
	require.NoError(t, err)
	defer c.Close()
	peer := server.NewTxnPeer(server.PeerConfig{Secret: secret})
	defer peer.Close()
	srv, err := server.New(server.Config{Listen: f[2], Logger: quiet, EventLoops: 1, Secret: secret,
		Options: storenode.Options{Dir: f[1], Sync: storenode.SyncNone, GrantVerifier: cluster.NewGrantVerifier(c, storenode.ErrFenced),
			LeaseChecker: c, TxnPeer: peer, TxnResolveAfter: 200 * time.Millisecond, TxnResolveInterval: 100 * time.Millisecond}})
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	fmt.Println("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() == "resolve" {
			if err := srv.Engine().ResolveTxns(ctx); err != nil {
				fmt.Printf("err %v\n", err)
			}
			p, _ := srv.Engine().TxnCounts()
			fmt.Printf("parts %d\n", p)
		}
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	srv.Shutdown(sctx)
}

// storeChild is a storage node in a child process, killed and restarted at one address over
// one directory.
type storeChild struct {
	t     *testing.T
	spec  string
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
}

func (s *storeChild) start() {
	t := s.t
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperStorageNode$", "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), storeHelperEnv+"="+s.spec)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	s.cmd, s.in, s.lines = cmd, in, make(chan string, 16)
	lines := s.lines
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	require.Equal(t, "ready", s.next())
}

func (s *storeChild) next() string {
	s.t.Helper()
	select {
	case l, ok := <-s.lines:
		require.True(s.t, ok, "the storage node child exited")
		return l
	case <-time.After(60 * time.Second): // a bound on a wait, not a synchronisation
		s.t.Fatal("no answer from the storage node child")
		return ""
	}
}

// kill kills the child with SIGKILL and reaps it.
func (s *storeChild) kill() {
	require.NoError(s.t, s.cmd.Process.Kill())
	s.cmd.Wait()
	for range s.lines {
	}
}

// resolve runs one resolver pass in the child and returns the parts it keeps.
func (s *storeChild) resolve() int {
	s.t.Helper()
	_, err := io.WriteString(s.in, "resolve\n")
	require.NoError(s.t, err)
	var n int
	l := s.next()
	_, err = fmt.Sscanf(l, "parts %d", &n)
	require.NoError(s.t, err, "child: %s", l)
	return n
}

// freeAddr returns a 127.0.0.1 address with a port free just now.
func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// A storage node (a child process) killed with -9 in the middle of transfers across storage
// nodes, and restarted over its directory at its address: the transfers go on once it is
// back (the transaction node's prepares, decisions and applies are sent again on the new
// connection, answered from what the storage node logged); at the end, every transaction is
// finished (the coordinator's node closed, the resolvers' passes run), the total is
// conserved, and the received counts hold every acknowledged transfer and at most those whose
// outcome was unknown besides.
func TestStorageNodeKilledDuringCrossNodeTransfers(t *testing.T) {
	if raceOn {
		t.Skip("a kill suite (child processes): not under -race; the plain pass runs it")
	}
	ctx := testCtx(t)
	before, after := 30, 30
	if testing.Short() {
		before, after = 12, 12
	}
	tc := startTxnCluster(t, 2, func(o *storenode.Options) {
		o.TxnResolveInterval = -1
		o.TxnResolveAfter = time.Millisecond
	})
	child := &storeChild{t: t, spec: tc.etcd.Endpoints()[0] + "|" + t.TempDir() + "|" + freeAddr(t)}
	child.start()
	defer func() {
		child.in.Close()
		child.cmd.Process.Kill()
		child.cmd.Wait()
	}()
	childAddr := strings.Split(child.spec, "|")[2]
	addrs := append(append([]string(nil), tc.addrs...), childAddr)

	a := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000"}, RequestTimeout: 30 * time.Second})
	ta, err := a.CreateTable(ctx, "acct", 64, partitions, 1, addrs)
	require.NoError(t, err)
	require.NoError(t, ta.Own(ctx, parts(partitions, 0)...))
	var ids, onChild []uint64
	for range 12 {
		id, err := ta.Insert(ctx, acctRow(initial, 0))
		require.NoError(t, err)
		ids = append(ids, id)
		if ta.NodeOf(id) == childAddr {
			onChild = append(onChild, id)
		}
	}
	require.NotEmpty(t, onChild)

	var acked, unknown atomic.Int64
	ackCh := make(chan struct{}, 1)
	var otherErrs []error
	var mu sync.Mutex
	stop := make(chan struct{})
	reached := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			for {
				select {
				case <-stop:
					return
				default:
				}
				// One end on the child's storage node, the other elsewhere.
				from := onChild[rng.IntN(len(onChild))]
				to := ids[rng.IntN(len(ids))]
				for ta.NodeOf(to) == childAddr {
					to = ids[rng.IntN(len(ids))]
				}
				if rng.IntN(2) == 0 {
					from, to = to, from
				}
				err := xfer(ctx, a, ta, from, to, uint64(1+rng.IntN(20)))
				switch {
				case err == nil:
					if acked.Add(1) == int64(before) {
						once.Do(func() { close(reached) })
					}
					select {
					case ackCh <- struct{}{}:
					default:
					}
				case errors.Is(err, txnode.ErrUnknownOutcome):
					unknown.Add(1)
				default:
					mu.Lock()
					otherErrs = append(otherErrs, err)
					mu.Unlock()
				}
			}
		}()
	}
	select {
	case <-reached:
	case <-ctx.Done():
		t.Fatal("no transfers")
	}
	child.kill()
	child.start()
	mark := acked.Load()
	// The transfers go on through the restarted storage node (each has an end there).
	for acked.Load() < mark+int64(after) {
		select {
		case <-ackCh:
		case <-ctx.Done():
			mu.Lock()
			t.Fatalf("transfers did not go on after the restart: %d acknowledged since, errors %v", acked.Load()-mark, otherErrs)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("acknowledged %d, unknown %d, failed %d", acked.Load(), unknown.Load(), len(otherErrs))
	require.NoError(t, a.Close(ctx)) // its lease revoked: the resolvers finish what it left

	for pass := 0; ; pass++ {
		left := child.resolve()
		for _, srv := range tc.srvs {
			require.NoError(t, srv.Engine().ResolveTxns(ctx))
			p, _ := srv.Engine().TxnCounts()
			left += p
		}
		if left == 0 {
			break
		}
		require.Less(t, pass, 200, "parts left in doubt: %d", left)
	}
	r := tc.open(t, 0xc, "")
	tr, err := r.OpenTable(ctx, "acct")
	require.NoError(t, err)
	var bal, rec uint64
	dst := make([]byte, 64)
	for _, id := range ids {
		require.NoError(t, tr.Get(ctx, id, dst))
		bal += balanceOf(dst)
		rec += receivedOf(dst)
	}
	require.Equal(t, uint64(len(ids))*initial, bal, "the total is conserved")
	require.GreaterOrEqual(t, rec, uint64(acked.Load()), "every acknowledged transfer is there")
	require.LessOrEqual(t, rec, uint64(acked.Load()+unknown.Load()), "and only those, or ones of unknown outcome")
}
