package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/internal/testseed"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// Kill -9 over TCP: the test binary re-executes itself as a storage node (TestServerHelper,
// which calls Serve on 127.0.0.1:0 and prints its address), 64 writers commit through sgio
// clients, and the test kills the child with SIGKILL at random moments and restarts it on the
// same directory. After each restart every writer's rows must check and carry the owner's
// last applied seq, which is at least its last acknowledged one: no acknowledged batch lost,
// no batch half applied.

const (
	srvHelperDirEnv  = "WEFT_SERVER_HELPER_DIR"
	srvHelperSyncEnv = "WEFT_SERVER_HELPER_SYNC"
	srvAddrPrefix    = "storenode-addr "
)

// TestServerHelper is the child storage node of TestServerKill9; it skips unless run as one.
// It serves until its stdin closes (the parent died) or it is killed.
func TestServerHelper(t *testing.T) {
	dir := testkit.HelperSpec(t, srvHelperDirEnv, "TestServerKill9")
	mode, _ := storenode.ParseSyncMode(os.Getenv(srvHelperSyncEnv))
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	err := Serve(ctx, Config{
		Listen: "127.0.0.1:0",
		Secret: srvSecret,
		Logger: logger,
		Options: storenode.Options{
			Dir:                dir,
			Sync:               mode,
			CacheBytes:         1 << 20,
			CheckpointWALBytes: 512 << 10, // checkpoints run often, so kills land in them too
			Logger:             logger,
		},
		OnListen: func(addr net.Addr) { fmt.Printf("%s%s\n", srvAddrPrefix, addr) },
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "storenode child:", err)
		os.Exit(1)
	}
}

// srvChild is a running child storage node.
type srvChild struct {
	cmd    *exec.Cmd
	addr   string
	stderr *testkit.SyncBuffer
	exited chan error
}

func startSrvChild(t *testing.T, dir string, mode storenode.SyncMode) *srvChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestServerHelper$", "-test.count=1", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), srvHelperDirEnv+"="+dir, srvHelperSyncEnv+"="+mode.String())
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	_, err = cmd.StdinPipe() // closed when the parent exits, which stops an orphaned child
	require.NoError(t, err)
	ch := &srvChild{cmd: cmd, stderr: &testkit.SyncBuffer{}, exited: make(chan error, 1)}
	cmd.Stderr = ch.stderr
	require.NoError(t, cmd.Start())
	addrs := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), srvAddrPrefix); ok {
				addrs <- a
			}
		}
		close(addrs)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() { ch.exited <- cmd.Wait() }()
	t.Cleanup(func() { ch.kill() })
	select {
	case a, ok := <-addrs:
		require.True(t, ok, "child exited before listening: %s", ch.stderr.String())
		ch.addr = a
	case <-time.After(srvTestTimeout):
		t.Fatalf("child did not listen within %v: %s", srvTestTimeout, ch.stderr.String())
	}
	return ch
}

// kill sends SIGKILL and waits for the child to be gone.
func (c *srvChild) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	if c.exited != nil {
		<-c.exited
		c.exited = nil
	}
}

// killWriter is one writer of the kill test: an owner with its own table.
type killWriter struct {
	stormWriter
	name string
}

func TestServerKill9(t *testing.T) {
	cycles := testseed.Scaled(5, 20, 200)
	const writers = 64
	seed := rand.Uint64()
	if s, ok := testseed.Replay(t); ok {
		seed = s
	}
	rng := rand.New(rand.NewPCG(seed, 2))
	t.Logf("seed %d (WEFT_SEED replays), %d cycles", seed, cycles)
	dir := t.TempDir()
	ws := make([]*killWriter, writers)
	for i := range ws {
		ws[i] = &killWriter{stormWriter: stormWriter{writer: i, owner: uint64(1000 + i)}, name: fmt.Sprintf("kill%02d", i)}
	}
	start := time.Now()
	var batches, checkpointsSeen uint64
	for cycle := 0; cycle <= cycles; cycle++ {
		mode := storenode.SyncNone
		if cycle%2 == 1 {
			mode = storenode.SyncAlways
		}
		child := startSrvChild(t, dir, mode)
		ctx, cancel := context.WithTimeout(context.Background(), srvTestTimeout)
		clients := make([]*sgio.Client, writers)
		for i, w := range ws {
			c, err := sgio.Dial(ctx, sgio.ClientConfig{Addr: child.addr, Secret: srvSecret, OwnerID: w.owner, DialTimeout: srvTestTimeout})
			require.NoError(t, err, "cycle %d: %s", cycle, child.stderr.String())
			clients[i] = c
			require.NoError(t, w.resume(ctx, c), "cycle %d (seed %d)", cycle, seed)
		}
		var st sgio.StatsReply
		if cycle == cycles {
			for _, c := range clients {
				_ = c.Close()
			}
			cancel()
			break
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i, w := range ws {
			depth := 1 + rng.IntN(8)
			wg.Go(func() { w.run(ctx, clients[i], depth, stop) })
		}
		// Kill at a random moment: a timer, not a synchronisation.
		<-time.After(time.Duration(50+rng.IntN(250)) * time.Millisecond)
		if err := clients[0].CallInto(ctx, &sgio.Stats{}, &st); err == nil {
			for _, s := range st.Stats {
				if s.Name == "checkpoints" {
					checkpointsSeen += s.Value
				}
			}
		}
		child.kill()
		close(stop)
		wg.Wait()
		for _, c := range clients {
			_ = c.Close()
		}
		cancel()
		for _, w := range ws {
			if w.err != nil && !errors.Is(w.err, sgio.ErrConnClosed) {
				t.Fatalf("cycle %d writer %d: %v (seed %d)", cycle, w.writer, w.err, seed)
			}
			w.err = nil
			batches = max(batches, w.acked)
		}
	}
	t.Logf("%d kill cycles in %v; writer 0 acknowledged %d batches, others up to %d; %d checkpoints seen before the kills",
		cycles, time.Since(start).Round(time.Millisecond), ws[0].acked, batches, checkpointsSeen)
}

// resume opens (or creates) the writer's table, takes ownership, checks what survived and
// continues after the owner's last applied seq.
func (w *killWriter) resume(ctx context.Context, c *sgio.Client) error {
	var ti sgio.TableInfo
	err := c.CallInto(ctx, &sgio.CreateTable{Name: w.name, RowBytes: 64}, &ti)
	if errors.Is(err, sgio.ErrTableExists) {
		err = c.CallInto(ctx, &sgio.OpenTable{Name: w.name}, &ti)
	}
	if err != nil {
		return err
	}
	// After a restart the old grant's lease is still running (leases outlive the storage
	// node's restarts); the same owner is granted again at once.
	var g sgio.Grant
	if err := c.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Owner: w.owner}, &g); err != nil {
		return err
	}
	if err := srvGrant(ctx, c, ti.Table, w.owner, g.Epoch, 2); err != nil {
		return err
	}
	if g.LastSeq < w.acked {
		return fmt.Errorf("writer %d: last applied seq %d, but seq %d was acknowledged", w.writer, g.LastSeq, w.acked)
	}
	if g.LastSeq > w.sent {
		return fmt.Errorf("writer %d: last applied seq %d, but only %d were sent", w.writer, g.LastSeq, w.sent)
	}
	var segs sgio.Segments
	err = c.CallInto(ctx, &sgio.ReadPages{Wants: []base.PageWant{{Table: ti.Table, Page: 0, Want: 0xf}, {Table: ti.Table, Page: 1, Want: 0xf}}}, &segs)
	if err != nil {
		return err
	}
	if err := checkStormRows(segs.Segments, w.writer, g.LastSeq); err != nil {
		return err
	}
	w.table, w.epoch, w.next = ti.Table, g.Epoch, g.LastSeq+1
	w.acked, w.sent = g.LastSeq, g.LastSeq
	return nil
}
