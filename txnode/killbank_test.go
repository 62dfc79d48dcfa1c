package txnode

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
)

// The bank invariant while the storage node is killed with -9 and restarted: the test binary
// re-executes itself as a storage node (TestHelperStorageNode), a transaction node in this
// process moves money in Durable mode, and the node is killed at random moments. Every
// transfer that returned success has its log row, and every balance equals its opening value
// plus the transfers in the log, whatever the kills did to transfers in flight.

const helperEnv = "WEFT_TXNODE_HELPER_STORENODE"

// helperLeaseEnv sets the helper storage node's lease (a time.ParseDuration string).
const helperLeaseEnv = "WEFT_TXNODE_HELPER_LEASE"

// TestHelperStorageNode is not a test: it is the storage node process of TestKillBank.
func TestHelperStorageNode(t *testing.T) {
	spec := testkit.HelperSpec(t, helperEnv, "TestKillBank")
	dir, addr, _ := strings.Cut(spec, "@")
	var lease time.Duration // storenode's default unless helperLeaseEnv says
	if v := os.Getenv(helperLeaseEnv); v != "" {
		var err error
		lease, err = time.ParseDuration(v)
		require.NoError(t, err)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer cancel()
	err := server.Serve(ctx, server.Config{
		Listen:   addr,
		Options:  storenode.Options{Dir: dir, Sync: storenode.SyncNone, CheckpointWALBytes: 1 << 20, LeaseDuration: lease},
		OnListen: func(net.Addr) { fmt.Println("listening"); os.Stdout.Sync() },
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "storage node:", err)
		os.Exit(1)
	}
}

type nodeProc struct {
	cmd *exec.Cmd
}

func startNodeProc(t *testing.T, dir, addr string) *nodeProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperStorageNode$", "-test.v=false")
	cmd.Env = append(os.Environ(), helperEnv+"="+dir+"@"+addr)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ok := false
		for sc.Scan() {
			if sc.Text() == "listening" && !ok {
				ok = true
				ready <- true
			}
		}
		if !ok {
			ready <- false
		}
	}()
	select {
	case ok := <-ready:
		require.True(t, ok, "storage node did not start")
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("storage node did not start within 30 s")
	}
	return &nodeProc{cmd: cmd}
}

func (p *nodeProc) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.cmd.Wait()
}

func freeLoopbackAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestKillBank(t *testing.T) {
	testkit.SkipUnderRace(t, "a kill suite (child processes)")
	ctx := context.Background()
	dir, addr := t.TempDir(), freeLoopbackAddr(t)
	node := startNodeProc(t, dir, addr)
	defer func() { node.kill() }()

	const owner = 99
	db := openDB(t, ctx, Options{StoreAddr: addr, OwnerID: owner, CacheBytes: 256 << 10, RequestTimeout: 30 * time.Second})
	acct := newTable(t, ctx, db, "acct", 64)
	logT := newTable(t, ctx, db, "log", 64)
	const accounts, opening = 5000, 1000
	ids := make([]uint64, accounts)
	for i := range ids {
		ids[i] = insertRow(t, ctx, acct, row(opening))
	}

	kills := 3
	duration := 3 * time.Second
	if testing.Short() {
		kills, duration = 2, 1500*time.Millisecond
	}
	var stop atomic.Bool
	var okCount, failCount atomic.Int64
	var mu sync.Mutex
	var succeeded []uint64 // log row ids of transfers that returned success
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			a, b := make([]byte, 64), make([]byte, 64)
			for !stop.Load() {
				from, to := ids[rng.IntN(accounts)], ids[rng.IntN(accounts)]
				if from == to {
					continue
				}
				amount := uint64(rng.IntN(10) + 1)
				var logID uint64
				err := db.Update(ctx, func(tx *Tx) error {
					if err := getTwo(tx, acct, from, to, a, b); err != nil {
						return err
					}
					va, vb := binary.LittleEndian.Uint64(a), binary.LittleEndian.Uint64(b)
					if va < amount {
						return errInsufficient
					}
					if err := tx.Put(acct, from, row(va-amount)); err != nil {
						return err
					}
					if err := tx.Put(acct, to, row(vb+amount)); err != nil {
						return err
					}
					entry := make([]byte, 64)
					binary.LittleEndian.PutUint64(entry[0:], from)
					binary.LittleEndian.PutUint64(entry[8:], to)
					binary.LittleEndian.PutUint64(entry[16:], amount)
					var err error
					logID, err = tx.Insert(logT, entry)
					return err
				})
				switch {
				case err == nil:
					okCount.Add(1)
					mu.Lock()
					succeeded = append(succeeded, logID)
					mu.Unlock()
				case errors.Is(err, errInsufficient):
				default:
					failCount.Add(1)
					t.Logf("transfer failed (allowed around a kill): %v", err)
					return
				}
			}
		}()
	}
	for i := range kills {
		// Let transfers run, then kill the storage node and start it again.
		time.Sleep(duration / time.Duration(kills+1)) // the workload's running time, not synchronisation
		node.kill()
		t.Logf("kill %d after %d transfers", i+1, okCount.Load())
		node = startNodeProc(t, dir, addr)
	}
	time.Sleep(duration / time.Duration(kills+1))
	stop.Store(true)
	wg.Wait()
	require.NoError(t, db.Close(ctx))
	require.Greater(t, okCount.Load(), int64(0))
	require.Zero(t, failCount.Load(), "no transfer may fail: the store reconnects and resends")

	// Verify with a fresh transaction node (same owner: it takes its tables back at once).
	db2 := openDB(t, ctx, Options{StoreAddr: addr, OwnerID: owner, CacheBytes: 1 << 20})
	defer db2.Close(ctx)
	acct2 := openTable(t, ctx, db2, "acct")
	log2 := openTable(t, ctx, db2, "log")
	expect := make(map[uint64]uint64, accounts)
	for _, id := range ids {
		expect[id] = opening
	}
	logged := make(map[uint64]bool)
	for r, err := range log2.Scan(ctx, 0, ^uint64(0)) {
		require.NoError(t, err)
		from, to, amount := binary.LittleEndian.Uint64(r.Data), binary.LittleEndian.Uint64(r.Data[8:]), binary.LittleEndian.Uint64(r.Data[16:])
		expect[from] -= amount
		expect[to] += amount
		logged[r.ID] = true
	}
	for _, id := range succeeded {
		require.True(t, logged[id], "transfer with log row %d returned success but is lost", id)
	}
	var total uint64
	for r, err := range acct2.Scan(ctx, 0, ^uint64(0)) {
		require.NoError(t, err)
		v := binary.LittleEndian.Uint64(r.Data)
		require.Equal(t, expect[r.ID], v, "account %d", r.ID)
		require.Less(t, v, uint64(1)<<62, "balance of %d went negative", r.ID)
		total += v
	}
	require.Equal(t, uint64(accounts*opening), total)
	t.Logf("%d transfers, %d logged, %d kills", okCount.Load(), len(logged), kills)
}

var errInsufficient = errors.New("insufficient funds")
