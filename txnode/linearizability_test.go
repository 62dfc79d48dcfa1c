package txnode

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"
)

// Linearizability through the public API, checked with porcupine: concurrent clients Put, Get
// and read-modify-write a few rows (each on its own page; Table, DB.Update/View and Session.Go
// calls at random), embedded (Durable and WriteBack)
// and against a storage node process that is killed (-9) and restarted under them. Every
// operation is recorded with a logical call and return time (one atomic counter, so real-time
// order is kept); a write that fails has an unknown outcome: it is recorded as returning
// never, with any result, and its client stops writing (so such writes stay few and the
// check stays fast). After the run a fresh node reads every row: what a crash kept must be a
// state the history explains.
//
// Sizes: plain `go test` (CI) runs a reduced history (a few thousand operations, seconds);
// -short a smaller one; WEFT_LINEARIZABILITY_OPS sets the operations per client for a longer
// run (histories stay well under 1M operations: the checker is exponential in the worst case).

const linKeys = 4

const (
	opGet = iota
	opPut
	opRMW
)

type linInput struct {
	op  int
	key int
	val uint64 // Put: the value; RMW: the amount added
}

type linOutput struct {
	val     uint64 // Get: the value read; RMW: the value before
	unknown bool   // a write whose outcome is unknown
}

// linModel is one register per key: Put sets it, Get reads it, RMW adds to it and returns
// the value it saw.
var linModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		var byKey [linKeys][]porcupine.Operation
		for _, op := range history {
			k := op.Input.(linInput).key
			byKey[k] = append(byKey[k], op)
		}
		var out [][]porcupine.Operation
		for _, ops := range byKey {
			if len(ops) > 0 {
				out = append(out, ops)
			}
		}
		return out
	},
	Init: func() any { return uint64(0) },
	Step: func(state, input, output any) (bool, any) {
		v, in, out := state.(uint64), input.(linInput), output.(linOutput)
		switch in.op {
		case opGet:
			return out.val == v, v
		case opPut:
			return true, in.val
		default:
			return out.unknown || out.val == v, v + in.val
		}
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(linInput), output.(linOutput)
		res := strconv.FormatUint(out.val, 10)
		if out.unknown {
			res = "?"
		}
		switch in.op {
		case opGet:
			return fmt.Sprintf("get(%d) -> %s", in.key, res)
		case opPut:
			return fmt.Sprintf("put(%d, %d)", in.key, in.val)
		default:
			return fmt.Sprintf("rmw(%d, +%d) -> %s", in.key, in.val, res)
		}
	},
}

// linRecorder collects a history.
type linRecorder struct {
	clock atomic.Int64
	mu    sync.Mutex
	ops   []porcupine.Operation
	// unknown counts writes of unknown outcome.
	unknown atomic.Int64
}

func (r *linRecorder) add(op porcupine.Operation) {
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
}

// linClient runs ops operations of client c on keys, recording them; after a write of
// unknown outcome it only reads. progress is called after each operation.
func linClient(t *testing.T, rec *linRecorder, db *DB, tb *Table, keys []uint64, c, ops int, progress func()) {
	rng := rand.New(rand.NewPCG(uint64(c), 99))
	ctx := context.Background()
	buf := make([]byte, tb.RowBytes())
	writing := true
	for i := range ops {
		k := rng.IntN(linKeys)
		in := linInput{op: opGet, key: k}
		if writing {
			switch n := rng.IntN(10); {
			case n < 3:
				in = linInput{op: opPut, key: k, val: uint64(c+1)<<32 | uint64(i+1)}
			case n < 6:
				in = linInput{op: opRMW, key: k, val: uint64(rng.IntN(5) + 1)}
			}
		}
		var out linOutput
		var err error
		call := rec.clock.Add(1)
		switch in.op {
		case opGet:
			if rng.IntN(2) == 0 {
				err = tb.Get(ctx, keys[k], buf)
			} else {
				err = db.View(ctx, func(tx *Tx) error { return tx.Get(tb, keys[k], buf) })
			}
			if err == nil {
				out.val = checkRow(t, buf)
			}
		case opPut:
			put := func(tx *Tx) error { return tx.Put(tb, keys[k], u64Row(tb.RowBytes(), in.val)) }
			switch rng.IntN(3) {
			case 0:
				err = tb.Put(ctx, keys[k], u64Row(tb.RowBytes(), in.val))
			case 1:
				err = db.Update(ctx, put)
			default:
				err = db.Session().Go(ctx, put).Wait(ctx) // visible at Go, returns when durable
			}
		case opRMW:
			if rng.IntN(2) == 0 {
				err = tb.Update(ctx, keys[k], func(r []byte) error {
					out.val = checkRow(t, r)
					fillRow(r, out.val+in.val)
					return nil
				})
			} else {
				err = db.Update(ctx, func(tx *Tx) error {
					if err := tx.Get(tb, keys[k], buf); err != nil {
						return err
					}
					out.val = checkRow(t, buf)
					return tx.Put(tb, keys[k], u64Row(tb.RowBytes(), out.val+in.val))
				})
			}
		}
		ret := rec.clock.Add(1)
		switch {
		case err == nil:
			rec.add(porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret})
		case in.op == opGet:
			// A failed read has no effect: it is left out.
			t.Logf("client %d: get failed (allowed around a kill): %v", c, err)
		default:
			t.Logf("client %d: write of unknown outcome, reads only from now: %v", c, err)
			rec.add(porcupine.Operation{ClientId: c, Input: in, Call: call, Output: linOutput{unknown: true}, Return: math.MaxInt64})
			rec.unknown.Add(1)
			writing = false
		}
		if progress != nil {
			progress()
		}
	}
}

// linCheck checks the history, writing a visualization where it is not linearizable.
func linCheck(t *testing.T, ops []porcupine.Operation) {
	t.Helper()
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(linModel, ops, time.Minute)
	t.Logf("porcupine: %v in %v", res, time.Since(start).Round(time.Millisecond))
	if res != porcupine.Ok {
		path := filepath.Join(os.TempDir(), fmt.Sprintf("weft-linearizability-%d.html", time.Now().UnixNano()))
		if err := porcupine.VisualizePath(linModel, info, path); err == nil {
			t.Logf("history visualized in %s", path)
		}
	}
	require.Equal(t, porcupine.Ok, res, "history of %d operations is not linearizable", len(ops))
}

// linSize returns clients and operations per client for this run.
func linSize(ciOps int) (clients, ops int) {
	clients, ops = 8, ciOps
	if testing.Short() {
		clients, ops = 4, ciOps/4
	}
	if s := os.Getenv("WEFT_LINEARIZABILITY_OPS"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			ops = min(n, 100_000)
		}
	}
	return clients, ops
}

// linFillerPages is how many pages of other rows the noise reader walks: more than a
// minCacheBytes cache holds, so the keys' pages are evicted and fetched again under the
// clients (misses and fills racing with writes).
const linFillerPages = 32

// linSetUp creates the table, the keys' rows (value 0, one page apart) and the filler rows.
func linSetUp(t *testing.T, db *DB) (tb *Table, keys, filler []uint64) {
	ctx := context.Background()
	tb = newTable(t, ctx, db, "lin", 64)
	ids := insertRows(t, db, tb, (linKeys+linFillerPages)*64)
	keys = make([]uint64, linKeys)
	for k := range keys {
		keys[k] = ids[k*64]
		require.NoError(t, tb.Put(ctx, keys[k], u64Row(64, 0)))
	}
	return tb, keys, ids[linKeys*64:]
}

// linNoise reads filler rows until stop is closed, to keep the cache evicting.
func linNoise(tb *Table, filler []uint64, stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	buf := make([]byte, tb.RowBytes())
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		_ = tb.Get(context.Background(), filler[(i*67)%len(filler)], buf) // errors around a kill are fine
	}
}

// linFinalReads reads every key with db (a fresh node) and adds the reads to the history,
// after everything else.
func linFinalReads(t *testing.T, rec *linRecorder, db *DB, client int) {
	ctx := context.Background()
	tb := openTable(t, ctx, db, "lin")
	ids := scanIDs(t, tb.Scan(ctx, 0, math.MaxUint64))
	buf := make([]byte, 64)
	for k := range linKeys {
		call := rec.clock.Add(1)
		require.NoError(t, tb.Get(ctx, ids[k*64], buf))
		rec.add(porcupine.Operation{ClientId: client, Input: linInput{op: opGet, key: k}, Call: call,
			Output: linOutput{val: checkRow(t, buf)}, Return: rec.clock.Add(1)})
	}
}

// TestLinearizabilityCheckerCatches: the checker and model reject a history that is not
// linearizable (a read of a value overwritten before the read began), so the tests below
// can fail.
func TestLinearizabilityCheckerCatches(t *testing.T) {
	bad := []porcupine.Operation{
		{ClientId: 0, Input: linInput{op: opPut, key: 1, val: 5}, Call: 1, Output: linOutput{}, Return: 2},
		{ClientId: 0, Input: linInput{op: opPut, key: 1, val: 6}, Call: 3, Output: linOutput{}, Return: 4},
		{ClientId: 1, Input: linInput{op: opGet, key: 1}, Call: 5, Output: linOutput{val: 5}, Return: 6},
	}
	require.Equal(t, porcupine.Illegal, porcupine.CheckOperationsTimeout(linModel, bad, time.Minute))
	lostRMW := []porcupine.Operation{
		{ClientId: 0, Input: linInput{op: opRMW, key: 0, val: 1}, Call: 1, Output: linOutput{val: 0}, Return: 4},
		{ClientId: 1, Input: linInput{op: opRMW, key: 0, val: 1}, Call: 2, Output: linOutput{val: 0}, Return: 3},
	}
	require.Equal(t, porcupine.Illegal, porcupine.CheckOperationsTimeout(linModel, lostRMW, time.Minute))
	unknown := append(bad[:2:2], porcupine.Operation{ClientId: 1, Input: linInput{op: opPut, key: 1, val: 5},
		Call: 2, Output: linOutput{unknown: true}, Return: math.MaxInt64}, bad[2])
	require.Equal(t, porcupine.Ok, porcupine.CheckOperationsTimeout(linModel, unknown, time.Minute),
		"a write of unknown outcome may land any time after its call")
}

func TestLinearizabilityEmbedded(t *testing.T) {
	clients, ops := linSize(8000)
	for _, mode := range []Durability{Durable, WriteBack} {
		t.Run(map[Durability]string{Durable: "durable", WriteBack: "writeback"}[mode], func(t *testing.T) {
			dir := t.TempDir()
			ctx := context.Background()
			db, err := Open(ctx, Options{Dir: dir, SyncMode: "none", Durability: mode, FlushInterval: time.Millisecond,
				CacheBytes: minCacheBytes, CacheWait: 10 * time.Second})
			require.NoError(t, err)
			tb, keys, filler := linSetUp(t, db)
			rec := &linRecorder{}
			var noise sync.WaitGroup
			stopNoise := make(chan struct{})
			noise.Add(1)
			go linNoise(tb, filler, stopNoise, &noise)
			var wg sync.WaitGroup
			for c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					linClient(t, rec, db, tb, keys, c, ops, nil)
				}()
			}
			wg.Wait()
			close(stopNoise)
			noise.Wait()
			t.Logf("cache: %+v", db.Stats())
			require.Zero(t, rec.unknown.Load(), "no write may fail without a crash")
			require.NoError(t, db.Close(ctx))
			db2 := openEmbedded(t, dir, Options{})
			linFinalReads(t, rec, db2, clients)
			linCheck(t, rec.ops)
			t.Logf("%d operations by %d clients: linearizable", len(rec.ops), clients)
		})
	}
}

// TestLinearizabilityKilledStore: the same against a storage node process killed with -9
// and restarted while the clients run (sync none: the WAL survives a kill of the process),
// Durable and WriteBack. The node reconnects and resends its batches; the final reads come
// from a fresh node after the last restart.
func TestLinearizabilityKilledStore(t *testing.T) {
	for _, mode := range []Durability{Durable, WriteBack} {
		t.Run(map[Durability]string{Durable: "durable", WriteBack: "writeback"}[mode], func(t *testing.T) {
			linKilledStore(t, mode)
		})
	}
}

func linKilledStore(t *testing.T, mode Durability) {
	clients, ops := linSize(6000)
	kills := 3
	if testing.Short() {
		kills = 1
	}
	ctx := context.Background()
	dir, addr := t.TempDir(), freeLoopbackAddr(t)
	node := startNodeProc(t, dir, addr)
	defer func() { node.kill() }()
	const owner = 4242
	db, err := Open(ctx, Options{StoreAddr: addr, OwnerID: owner, CacheBytes: minCacheBytes, Durability: mode,
		FlushInterval: time.Millisecond, CacheWait: 10 * time.Second, RequestTimeout: 30 * time.Second})
	require.NoError(t, err)
	tb, keys, filler := linSetUp(t, db)
	var noise sync.WaitGroup
	stopNoise := make(chan struct{})
	noise.Add(1)
	go linNoise(tb, filler, stopNoise, &noise)

	rec := &linRecorder{}
	var done atomic.Int64
	total := int64(clients * ops)
	step := total / int64(kills+1)
	reached := make(chan struct{}, 1)
	progress := func() {
		if done.Add(1)%max(step/4, 1) == 0 {
			select {
			case reached <- struct{}{}:
			default:
			}
		}
	}
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			linClient(t, rec, db, tb, keys, c, ops, progress)
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	for i := range kills {
		// Kill once the clients have done their share of operations before this kill.
		for done.Load() < int64(i+1)*step {
			select {
			case <-reached:
			case <-finished:
			case <-time.After(60 * time.Second):
				require.FailNow(t, "clients made no progress")
			}
			if done.Load() >= total {
				break
			}
		}
		node.kill()
		t.Logf("kill %d after %d operations", i+1, done.Load())
		node = startNodeProc(t, dir, addr)
	}
	recvWithin(t, finished, "the clients")
	close(stopNoise)
	noise.Wait()
	t.Logf("cache: %+v", db.Stats())
	require.NoError(t, db.Close(ctx))
	require.LessOrEqual(t, rec.unknown.Load(), int64(clients), "a client stops writing after one unknown outcome")

	db2 := openDB(t, ctx, Options{StoreAddr: addr, OwnerID: owner})
	defer db2.Close(ctx)
	linFinalReads(t, rec, db2, clients)
	linCheck(t, rec.ops)
	t.Logf("%d operations by %d clients across %d kills (%d of unknown outcome): linearizable",
		len(rec.ops), clients, kills, rec.unknown.Load())
}
