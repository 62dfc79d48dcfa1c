//go:build unix

package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// helperEnv names the etcd endpoint and prefix of TestHelperFrozenOwner's child process.
const helperEnv = "WEFT_CLUSTER_HELPER"

// TestHelperFrozenOwner is the child of TestOwnershipFrozenOwner (it does nothing unless
// started by it): it owns partition 0 of table "t" and answers the parent's commands on
// stdin, one line each: "check" prints the ownership's Check as ok, lapsed or lost; "wait"
// waits for the ownership to be lost and prints lost.
func TestHelperFrozenOwner(t *testing.T) {
	spec := os.Getenv(helperEnv)
	if spec == "" {
		t.Skip("helper process only")
	}
	endpoint, prefix, _ := strings.Cut(spec, "|")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Connect(ctx, Config{Endpoints: []string{endpoint}, Prefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer c.Close()
	s, err := c.NewSession(ctx, SessionConfig{Owner: 1, TTL: testTTL})
	require.NoError(t, err)
	defer s.Close(ctx)
	o, err := s.Acquire(ctx, "t", 0)
	require.NoError(t, err)
	fmt.Printf("epoch %d\n", o.Epoch())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "check":
			err := o.Check()
			switch {
			case err == nil:
				fmt.Println("ok")
			case errors.Is(err, ErrLost):
				fmt.Println("lost")
			case errors.Is(err, ErrLapsed):
				fmt.Println("lapsed")
			default:
				fmt.Println("error", err)
			}
		case "wait":
			select {
			case <-o.Done():
				fmt.Println("lost")
			case <-ctx.Done():
				fmt.Println("timeout")
			}
		}
	}
}

// An owner process frozen (SIGSTOP) past its lease: another node takes the partition with a
// higher epoch; resumed (SIGCONT), the frozen owner vouches for nothing, at once (its clock,
// not its keepalive goroutine, decides), and learns the grant is lost.
func TestOwnershipFrozenOwner(t *testing.T) {
	ctx := testCtx(t)
	srv := sharedEtcd(t)
	prefix := newPrefix(t)
	c := connect(t, prefix, srv.Endpoints()...)
	createTable(t, c, "t", 1)

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperFrozenOwner$", "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), helperEnv+"="+srv.Endpoints()[0]+"|"+prefix)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	defer func() {
		cmd.Process.Signal(syscall.SIGCONT)
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}()
	lines := make(chan string, 8)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func() string {
		t.Helper()
		select {
		case l, ok := <-lines:
			require.True(t, ok, "the child exited")
			return l
		case <-ctx.Done():
			t.Fatal("no answer from the child")
			return ""
		}
	}
	var epoch uint64
	_, err = fmt.Sscanf(next(), "epoch %d", &epoch)
	require.NoError(t, err)
	send := func(cmd string) { _, err := io.WriteString(stdin, cmd+"\n"); require.NoError(t, err) }
	send("check")
	require.Equal(t, "ok", next())

	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	b := newSession(t, c, 2, nil)
	ob, err := b.AcquireWait(ctx, "t", 0)
	require.NoError(t, err)
	require.Greater(t, ob.Epoch(), epoch)

	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	send("check")
	require.Contains(t, []string{"lapsed", "lost"}, next(), "a resumed owner vouched for a grant taken over")
	send("wait")
	require.Equal(t, "lost", next())
	send("check")
	require.Equal(t, "lost", next())
}
