//go:build unix

package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster/proctest"
	"github.com/weftdb/weft/internal/testkit"
)

// helperEnv names the etcd endpoint and prefix of TestHelperFrozenOwner's child process.
const helperEnv = "WEFT_CLUSTER_HELPER"

// TestHelperFrozenOwner is the child of TestOwnershipFrozenOwner (it does nothing unless
// started by it): it owns partition 0 of table "t" and answers the parent's commands on
// stdin, one line each: "check" prints the ownership's Check as ok, lapsed or lost; "wait"
// waits for the ownership to be lost and prints lost.
func TestHelperFrozenOwner(t *testing.T) {
	spec := testkit.HelperSpec(t, helperEnv, "TestOwnershipFrozenOwner")
	endpoint, prefix, _ := strings.Cut(spec, "|")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Connect(ctx, Config{Endpoints: []string{endpoint}, Prefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer c.Close()
	s, err := c.NewSession(ctx, SessionConfig{Owner: 1, TTL: testTTL})
	require.NoError(t, err)
	defer s.Close(ctx)
	o := acquire(t, ctx, s, "t", 0)
	fmt.Printf("epoch %d\n", o.Epoch())
	for cmd := range proctest.ChildInput() {
		switch cmd {
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
	testkit.SkipUnderRace(t, "a freeze suite (child processes)")
	ctx := testCtx(t)
	srv := sharedEtcd(t)
	prefix := newPrefix(t)
	c := connect(t, prefix, srv.Endpoints()...)
	createTable(t, c, "t", 1)

	child := proctest.Start(t, proctest.Spec{Name: "frozen owner", Test: "TestHelperFrozenOwner",
		Env: []string{helperEnv + "=" + srv.Endpoints()[0] + "|" + prefix}, Ready: "epoch "})
	var epoch uint64
	_, err := fmt.Sscanf(child.Ready(), "epoch %d", &epoch)
	require.NoError(t, err)
	require.Equal(t, "ok", child.Ask(ctx, "check"))

	child.Stop()
	b := newSession(t, c, 2, nil)
	ob, err := b.AcquireWait(ctx, "t", 0)
	require.NoError(t, err)
	require.Greater(t, ob.Epoch(), epoch)

	child.Cont()
	require.Contains(t, []string{"lapsed", "lost"}, child.Ask(ctx, "check"), "a resumed owner vouched for a grant taken over")
	require.Equal(t, "lost", child.Ask(ctx, "wait"))
	require.Equal(t, "lost", child.Ask(ctx, "check"))
}
