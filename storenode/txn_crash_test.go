package storenode

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testkit"
)

// The two-phase commit's crash test: a child process runs one transfer between two stores
// (a: the primary and participant 0, b: participant 1) step by step, printing each step once
// it returned, and stops after step txnCrashStopEnv; the parent kills it with -9 there,
// reopens both stores and checks what each step promised, then lets the resolvers finish the
// transaction with the coordinator's lease gone: the total is conserved and the transfer is
// applied on both stores or on neither, as the primary decided.

const (
	txnCrashDirEnv  = "WEFT_TXN_CRASH_DIR"
	txnCrashStopEnv = "WEFT_TXN_CRASH_STOP"
	txnCrashCkptEnv = "WEFT_TXN_CRASH_CKPT"
	txnCrashLease   = 77
	txnCrashBalance = 1000
	txnCrashAmount  = 10
)

// The steps of the transfer, in the order the coordinator runs them.
var txnCrashSteps = []string{"prepared-a", "prepared-b", "decided", "applied-a", "applied-b", "reported"}

func txnCrashOptions(dir string, peers *memPeers, leases *memLeases, clock *fakeClock) Options {
	o := Options{Dir: dir, Sync: SyncNone, TxnResolveInterval: -1, TxnPeer: peers, TxnResolveAfter: time.Second}
	if leases != nil {
		o.LeaseChecker = leases
	}
	if clock != nil {
		o.Now = clock.Now
	}
	return o
}

// TestHelperTxnCrash is the child: it runs the transfer's steps through txnCrashStopEnv, then
// waits to be killed.
func TestHelperTxnCrash(t *testing.T) {
	dir := testkit.HelperSpec(t, txnCrashDirEnv, "TestTxnKill9")
	stop, err := strconv.Atoi(os.Getenv(txnCrashStopEnv))
	require.NoError(t, err)
	ckpt := os.Getenv(txnCrashCkptEnv) == "1"
	peers := &memPeers{}
	ea := openEngine(t, txnCrashOptions(filepath.Join(dir, "a"), peers, nil, nil))
	eb, err := Open(txnCrashOptions(filepath.Join(dir, "b"), peers, nil, nil))
	require.NoError(t, err)
	peers.set("a", ea)
	peers.set("b", eb)
	a, b := setupTxnStore(t, ea), setupTxnStore(t, eb)
	a.put(t, 1, txnCrashBalance)
	b.put(t, 1, txnCrashBalance)
	ctx := context.Background()
	id := txnID(1)
	for step, name := range txnCrashSteps {
		switch name {
		case "prepared-a":
			_, err = a.prepare(t, id, txnCrashLease, "", 0, 1, txnCrashBalance-txnCrashAmount)
		case "prepared-b":
			_, err = b.prepare(t, id, txnCrashLease, "a", 1, 1, txnCrashBalance+txnCrashAmount)
		case "decided":
			_, err = ea.DecideTxn(ctx, id, txnCrashLease, base.DecisionCommit, 2)
		case "applied-a":
			err = ea.ApplyTxn(id, base.DecisionCommit)
		case "applied-b":
			err = eb.ApplyTxn(id, base.DecisionCommit)
		case "reported":
			err = eb.ResolveTxns(ctx)
			if err == nil {
				err = ea.ResolveTxns(ctx)
			}
		}
		require.NoError(t, err, "step %s", name)
		if ckpt {
			require.NoError(t, ea.Checkpoint())
			require.NoError(t, eb.Checkpoint())
		}
		fmt.Printf("step %d\n", step)
		if step == stop {
			break
		}
	}
	select {} // until killed
}

// TestTxnKill9 kills the child after every step, with and without checkpoints between the
// steps, and checks recovery and resolution.
func TestTxnKill9(t *testing.T) {
	for _, ckpt := range []bool{false, true} {
		for stop := range txnCrashSteps {
			t.Run(fmt.Sprintf("ckpt=%v/stop=%s", ckpt, txnCrashSteps[stop]), func(t *testing.T) {
				dir := t.TempDir()
				runTxnCrashChild(t, dir, stop, ckpt)
				checkTxnCrash(t, dir, stop)
			})
		}
	}
}

func runTxnCrashChild(t *testing.T, dir string, stop int, ckpt bool) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperTxnCrash$", "-test.count=1")
	c := "0"
	if ckpt {
		c = "1"
	}
	cmd.Env = append(os.Environ(), txnCrashDirEnv+"="+dir, txnCrashStopEnv+"="+strconv.Itoa(stop), txnCrashCkptEnv+"="+c)
	child := testkit.StartChild(t, cmd, 45*time.Second)
	defer child.Stop() // a failed check must not leave the child running
	stdout, stderr, kill := child.Stdout, child.Stderr, child.Kill
	sc := bufio.NewScanner(stdout)
	last := -1
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "step" {
			last, _ = strconv.Atoi(f[1])
			if last == stop {
				kill()
			}
		}
	}
	_ = cmd.Wait()
	require.Equal(t, stop, last, "the child stopped early: %s", stderr.String())
}

func checkTxnCrash(t *testing.T, dir string, stop int) {
	peers, leases, clock := &memPeers{}, &memLeases{}, &fakeClock{}
	ea := openEngine(t, txnCrashOptions(filepath.Join(dir, "a"), peers, leases, clock))
	defer ea.Close()
	eb := openEngine(t, txnCrashOptions(filepath.Join(dir, "b"), peers, leases, clock))
	defer eb.Close()
	peers.set("a", ea)
	peers.set("b", eb)
	a, b := setupTxnStore(t, ea), setupTxnStore(t, eb)
	id := txnID(1)
	reached := func(name string) bool {
		for i := 0; i <= stop; i++ {
			if txnCrashSteps[i] == name {
				return true
			}
		}
		return false
	}
	sa, sb := ea.TxnStatus(id), eb.TxnStatus(id)
	// What each acknowledged step promised survived the kill.
	if reached("prepared-a") && !reached("applied-a") {
		require.True(t, sa.Prepared, "a: %+v", sa)
	}
	if reached("prepared-b") && !reached("applied-b") {
		require.True(t, sb.Prepared, "b: %+v", sb)
	}
	if reached("decided") && !reached("reported") {
		require.Equal(t, base.DecisionCommit, sa.Primary, "a: %+v", sa)
	}
	if reached("applied-a") {
		require.Equal(t, uint64(txnCrashBalance-txnCrashAmount), a.get(t, 1))
	} else {
		require.Equal(t, uint64(txnCrashBalance), a.get(t, 1), "nothing applied before the decision")
	}
	if reached("applied-b") {
		require.Equal(t, uint64(txnCrashBalance+txnCrashAmount), b.get(t, 1))
	} else {
		require.Equal(t, uint64(txnCrashBalance), b.get(t, 1))
	}

	// The coordinator is dead: its lease goes, the resolvers finish the transaction.
	leases.kill(txnCrashLease)
	clock.Advance(time.Second)
	ctx := context.Background()
	for range 2 {
		require.NoError(t, eb.ResolveTxns(ctx))
		require.NoError(t, ea.ResolveTxns(ctx))
	}
	committed := reached("decided")
	va, vb := a.get(t, 1), b.get(t, 1)
	require.Equal(t, uint64(2*txnCrashBalance), va+vb, "total conserved")
	if committed {
		require.Equal(t, uint64(txnCrashBalance-txnCrashAmount), va, "decided commit: applied on both")
	} else {
		require.Equal(t, uint64(txnCrashBalance), va, "undecided: aborted on both")
	}
	for _, e := range []*Engine{ea, eb} {
		parts, _ := e.TxnCounts()
		require.Zero(t, parts, "every part resolved and reported")
	}
	if committed {
		_, decisions := ea.TxnCounts()
		require.Zero(t, decisions, "the commit is forgotten once both reported")
	} else {
		_, err := ea.DecideTxn(ctx, id, txnCrashLease, base.DecisionCommit, 2)
		require.ErrorIs(t, err, ErrTxnDecided, "a late commit after the resolvers' abort")
	}
}
