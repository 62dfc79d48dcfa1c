package txnode

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The bank: concurrent random transfers between many accounts, each transfer logged in the
// same transaction, in a cache far smaller than the accounts. Serializability shows in three
// invariants checked afterwards, and again after a reopen: the total is conserved, no balance
// is negative, and every balance is its opening value plus the logged transfers.

// Account rows: balance, then the account's number, then ^balance (a torn row breaks it).
// Log rows: from, to, amount (ids of accounts).
const (
	bankRowBytes = 64
	bankOpening  = 1000
)

func bankBalance(row []byte) (uint64, error) {
	bal := binary.LittleEndian.Uint64(row)
	if binary.LittleEndian.Uint64(row[56:]) != ^bal {
		return 0, errTornAccount
	}
	return bal, nil
}

func setBankBalance(row []byte, bal uint64) {
	binary.LittleEndian.PutUint64(row, bal)
	binary.LittleEndian.PutUint64(row[56:], ^bal)
}

func TestBank(t *testing.T) {
	accounts, workers, run := 100_000, 128, 2*time.Second
	if testing.Short() {
		accounts, run = 20_000, time.Second // still 1.5 times what the cache holds
	}
	for _, cfg := range openConfigs(t) {
		t.Run(cfg.name, func(t *testing.T) {
			open := cfg.opener(t)
			// 128 transactions of up to five pages each want more than the cache holds: they
			// queue for frames. A long CacheWait keeps a slow (-race, loaded) run from
			// reporting that queueing as ErrCacheFull.
			opts := Options{CacheBytes: 1 << 20, CacheWait: 10 * time.Second}
			db := open(opts)
			bankRun(t, db, accounts, workers, run)
			require.NoError(t, db.Close(context.Background()))
			bankCheck(t, open(opts), accounts)
		})
	}
}

type bankTables struct{ acct, log *Table }

func bankOpen(t testing.TB, db *DB, create bool) bankTables {
	ctx := context.Background()
	var bt bankTables
	var err error
	if create {
		bt.acct, err = db.CreateTable(ctx, "acct", bankRowBytes)
		require.NoError(t, err)
		bt.log, err = db.CreateTable(ctx, "log", bankRowBytes)
		require.NoError(t, err)
		return bt
	}
	bt.acct, err = db.Table(ctx, "acct")
	require.NoError(t, err)
	bt.log, err = db.Table(ctx, "log")
	require.NoError(t, err)
	return bt
}

func bankRun(t *testing.T, db *DB, accounts, workers int, run time.Duration) {
	ctx := context.Background()
	bt := bankOpen(t, db, true)
	ids := make([]uint64, 0, accounts)
	const perTx = 1000
	row := make([]byte, bankRowBytes)
	for lo := 0; lo < accounts; lo += perTx {
		var batch []uint64
		require.NoError(t, db.Update(ctx, func(tx *Tx) error {
			batch = batch[:0] // the closure may run again
			for i := lo; i < min(accounts, lo+perTx); i++ {
				setBankBalance(row, bankOpening)
				binary.LittleEndian.PutUint64(row[8:], uint64(i))
				id, err := tx.Insert(bt.acct, row)
				if err != nil {
					return err
				}
				batch = append(batch, id)
			}
			return nil
		}))
		ids = append(ids, batch...)
	}

	var transfers, skipped atomic.Int64
	var cacheMax atomic.Int64
	deadline := time.Now().Add(run)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			a, b, logRow := make([]byte, bankRowBytes), make([]byte, bankRowBytes), make([]byte, bankRowBytes)
			for i := 0; time.Now().Before(deadline); i++ {
				// One to three transfers along a chain of distinct accounts.
				hops := 1 + rng.IntN(3)
				chain := [4]uint64{}
				for k := 0; k <= hops; k++ {
				again:
					chain[k] = ids[rng.IntN(len(ids))]
					for j := range k {
						if chain[j] == chain[k] {
							goto again
						}
					}
				}
				amount := uint64(1 + rng.IntN(bankOpening/2))
				made := 0
				err := db.Update(ctx, func(tx *Tx) error {
					made = 0
					for k := range hops {
						from, to := chain[k], chain[k+1]
						if err := tx.Get(bt.acct, from, a); err != nil {
							return err
						}
						if err := tx.Get(bt.acct, to, b); err != nil {
							return err
						}
						fa, err := bankBalance(a)
						if err != nil {
							return err
						}
						tb, err := bankBalance(b)
						if err != nil {
							return err
						}
						if fa < amount {
							continue // no overdrafts
						}
						setBankBalance(a, fa-amount)
						setBankBalance(b, tb+amount)
						if err := tx.Put(bt.acct, from, a); err != nil {
							return err
						}
						if err := tx.Put(bt.acct, to, b); err != nil {
							return err
						}
						binary.LittleEndian.PutUint64(logRow, from)
						binary.LittleEndian.PutUint64(logRow[8:], to)
						binary.LittleEndian.PutUint64(logRow[16:], amount)
						if _, err := tx.Insert(bt.log, logRow); err != nil {
							return err
						}
						made++
					}
					return nil
				})
				if err != nil {
					t.Errorf("worker %d: transfer: %v", w, err)
					return
				}
				transfers.Add(int64(made))
				if made < hops {
					skipped.Add(int64(hops - made))
				}
				if i%64 == 0 {
					st := db.Stats()
					for {
						m := cacheMax.Load()
						if st.CacheBytes <= m || cacheMax.CompareAndSwap(m, st.CacheBytes) {
							break
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	require.False(t, t.Failed())
	st := db.Stats()
	t.Logf("%d transfers (%d skipped for want of funds) in %v; %+v", transfers.Load(), skipped.Load(), run, st)
	require.Positive(t, transfers.Load())
	require.LessOrEqual(t, cacheMax.Load(), int64(1<<20), "cache over its budget")
	require.Positive(t, st.Evictions, "the accounts should not fit the cache")
	bankCheck(t, db, accounts)
}

// bankCheck verifies the invariants: conservation, no negative balance (no wrap-around of the
// unsigned balance), and balances that match the log.
func bankCheck(t *testing.T, db *DB, accounts int) {
	ctx := context.Background()
	bt := bankOpen(t, db, false)
	// The workers have stopped, so plain scans see a consistent state. (A serializable
	// Tx.Scan pins every page it reads until commit: the accounts do not fit the cache.)
	want := make(map[uint64]int64, accounts)
	for r, err := range bt.acct.Scan(ctx, 0, math.MaxUint64) {
		require.NoError(t, err)
		want[r.ID] = bankOpening
	}
	require.Len(t, want, accounts)
	logs := 0
	for r, err := range bt.log.Scan(ctx, 0, math.MaxUint64) {
		require.NoError(t, err)
		from, to, amount := binary.LittleEndian.Uint64(r.Data), binary.LittleEndian.Uint64(r.Data[8:]), int64(binary.LittleEndian.Uint64(r.Data[16:]))
		_, okFrom := want[from]
		_, okTo := want[to]
		require.True(t, okFrom && okTo, "log row %d names unknown accounts %d -> %d", r.ID, from, to)
		want[from] -= amount
		want[to] += amount
		logs++
	}
	var total int64
	n := 0
	for r, err := range bt.acct.Scan(ctx, 0, math.MaxUint64) {
		require.NoError(t, err)
		bal, err := bankBalance(r.Data)
		require.NoError(t, err, "account %d", r.ID)
		require.LessOrEqual(t, bal, uint64(accounts*bankOpening), "account %d: balance wrapped below zero", r.ID)
		require.Equal(t, want[r.ID], int64(bal), "account %d: balance does not match the log", r.ID)
		total += int64(bal)
		n++
	}
	require.Equal(t, accounts, n)
	require.Equal(t, int64(accounts*bankOpening), total, "money was created or destroyed")
	t.Logf("checked %d accounts against %d log rows", n, logs)
}

var errTornAccount = errors.New("bank: torn account row")
