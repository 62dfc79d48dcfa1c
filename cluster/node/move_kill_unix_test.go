//go:build unix

package node_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weftdb/weft/cluster/node"
)

// moveKillEnv carries "etcd endpoint|table|target|step|owner id" to TestHelperMover.
const moveKillEnv = "WEFT_MOVE_KILL_HELPER"

// TestHelperMover is the child of TestMoveKilledAtEachStep (it does nothing unless started
// by it): a cluster node that moves partition 0 of the table to the target and kills itself
// with SIGKILL right after the given step.
func TestHelperMover(t *testing.T) {
	spec := os.Getenv(moveKillEnv)
	if spec == "" {
		t.Skip("helper process only")
	}
	f := strings.Split(spec, "|")
	owner, err := strconv.ParseUint(f[4], 10, 64)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n := openHelperNode(t, ctx, f[0], owner, "")
	tbl, err := n.OpenTable(ctx, f[1])
	require.NoError(t, err)
	fmt.Printf("lease %d\n", n.Session().Lease())
	node.SetMoveStepHook(func(step string) {
		if step == f[3] {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	})
	require.NoError(t, tbl.Move(ctx, 0, f[2]))
	fmt.Println("moved")
}

// A mover killed with -9 after each step of a move (and, at two steps, the source storage
// node killed with -9 and restarted as well), while the partition's owner writes: the next
// Move completes the move, every acknowledged write is on the new copy, the owner owns the
// partition there and writes on, the old copy serves nothing.
func TestMoveKilledAtEachStep(t *testing.T) {
	if raceOn {
		t.Skip("a kill suite (child processes): not under -race; the plain pass runs it")
	}
	ctx := testCtx(t)
	steps := []string{node.MoveStepRecorded, node.MoveStepIncoming, node.MoveStepCopied, node.MoveStepCaughtUp,
		node.MoveStepFrozen, node.MoveStepFinal, node.MoveStepSwitched, node.MoveStepActivated, node.MoveStepRetired}
	rows := 30
	if testing.Short() {
		rows = 12
	}
	killStore := map[string]bool{node.MoveStepCopied: true, node.MoveStepFrozen: true}
	tc := startCluster(t, 1) // the target, in process
	endpoint := tc.etcd.Endpoints()[0]
	store := startStoreProc(t, endpoint, "127.0.0.1:0", storeGrants) // the source
	addr := store.Addr
	target := tc.addrs[0]
	reader := tc.open(t, 0x3, "")
	mover := tc.open(t, 0x2, "")
	for i, step := range steps {
		name := fmt.Sprintf("k%d", i)
		// An owner node per step: a write refused by a frozen source fail-stops the owner's
		// commit pipeline to that storage node (txnode today), its other tables there too.
		owner := tc.open(t, 0x100+uint64(i), "game-1:7000")
		tbl := createTable(t, ctx, owner, name, 64, 2, 1, []string{addr, target})
		w := newMoveWriter(t, ctx, owner, tbl, rows)
		for v := range uint64(rows) {
			require.False(t, w.put(t, ctx, int(v), 10+v))
		}

		c := startHelper(t, "TestHelperMover", fmt.Sprintf("%s=%s|%s|%s|%s|%d", moveKillEnv, endpoint, name, target, step, 0x200+i), "lease ")
		lease, err := strconv.ParseInt(strings.TrimPrefix(c.Ready(), "lease "), 10, 64)
		require.NoError(t, err)
		require.Empty(t, lineOrExit(t, ctx, c, "moved"), "step %s: the mover was killed", step)
		werr := c.Wait(ctx)
		require.True(t, killedBySIGKILL(werr), "step %s: the mover killed itself at the step: %v", step, werr)
		// The dead mover's lease ends (revoked here rather than waited out: lease expiry is
		// tested in package cluster), so the next mover may take the move over.
		_, err = tc.c.Etcd().Revoke(ctx, clientv3.LeaseID(lease))
		require.NoError(t, err)
		if killStore[step] {
			store.restart()
		}
		// The owner writes on: acknowledged (the source still live) or refused.
		lost := false
		for v := range uint64(rows) {
			if w.put(t, ctx, int(v), 100+v) {
				lost = true
				break
			}
		}
		rec, recorded, err := tc.c.ReadMove(ctx, name, 0)
		require.NoError(t, err)
		require.True(t, recorded, "step %s: the record outlives the mover", step)
		require.Equal(t, target, rec.To)

		if step == node.MoveStepSwitched {
			// Switched, not active yet: owning the partition on the target is refused for
			// now (the copy takes no grant yet), and works once the move is complete.
			tbl2 := openTable(t, ctx, owner, name)
			require.Error(t, tbl2.Own(ctx, 0))
		}
		// The next Move completes it.
		mtbl := openTable(t, ctx, mover, name)
		require.NoError(t, mtbl.Move(ctx, 0, target), "step %s", step)
		if !lost {
			// The switch kept the grant: the write is refused (the frozen source), or the
			// handle followed the map and owns the partition on the new copy under it
			// (follow.go).
			w.put(t, ctx, 0, 1000)
		}
		w.reown(t, ctx)
		require.False(t, w.put(t, ctx, 1, 2000), "step %s: the owner writes on the new copy", step)
		require.Equal(t, target, w.tbl.NodeOf(w.ids[0]))
		w.check(t, ctx, reader)
		_, recorded, err = tc.c.ReadMove(ctx, name, 0)
		require.NoError(t, err)
		require.False(t, recorded)
	}
	require.NoError(t, store.CloseInput())
}
