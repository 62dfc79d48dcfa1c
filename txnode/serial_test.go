package txnode

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The serializability stress suite: the classic anomalies that weaker isolation allows, each
// raced many times through the public API, in Durable and WriteBack mode (the embedded store;
// the remote one too outside -short). A transaction that gives up with ErrConflict (after
// Options.MaxRetries) simply did not happen; every invariant below holds for the
// transactions that committed.
//
//   - write skew: two on-call doctors, each may leave only if the other stays;
//   - lost update: concurrent increments of one counter;
//   - the read-only anomaly (Fekete, O'Neil, O'Neil 2004): a read-only transaction that sees
//     a deposit but not a withdrawal that did not see the deposit;
//   - phantoms: insert-if-empty on a fresh table, insert-if-empty past the id high-water mark
//     (the insert needs a new id grant), by Scan and by Get, and insert-if-fewer-than-K;
//   - a bank with transfers and concurrent auditors, by Get in View and by Tx.Scan.

func serialConfigs(t *testing.T) []openConfig {
	cfgs := openConfigs(t)
	if testing.Short() {
		return cfgs[:2] // embedded durable and writeback
	}
	return cfgs
}

// serialRounds is how many times each race is run.
func serialRounds() int {
	if testing.Short() {
		return 50
	}
	return 300
}

// race runs fns concurrently, released together, and waits for them.
func race(fns ...func()) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, fn := range fns {
		wg.Go(func() {
			<-start
			fn()
		})
	}
	close(start)
	wg.Wait()
}

// valueOf decodes a signed value from a u64Row.
func valueOf(t testing.TB, row []byte) int64 { return int64(checkRow(t, row)) }

func valueRow(v int64) []byte { return u64Row(64, uint64(v)) }

// okOrConflict fails the test for any error but ErrConflict and reports whether err is nil.
func okOrConflict(t testing.TB, err error) bool {
	if err != nil && !errors.Is(err, ErrConflict) {
		t.Errorf("unexpected error: %v", err)
	}
	return err == nil
}

// getPair reads rows x and y of tb in tx (y only once x was read).
func getPair(tx *Tx, tb *Table, x, y uint64) (a, b []byte, err error) {
	a, b = make([]byte, 64), make([]byte, 64)
	if err = tx.Get(tb, x, a); err == nil {
		err = tx.Get(tb, y, b)
	}
	return a, b, err
}

func TestSerialWriteSkew(t *testing.T) {
	eachConfig(t, serialConfigs(t), Options{}, func(t *testing.T, db *DB) {
		ctx := context.Background()
		tb, ids := newTableRows(t, ctx, db, "oncall", 2)
		for round := range serialRounds() {
			require.NoError(t, tb.Put(ctx, ids[0], valueRow(1)))
			require.NoError(t, tb.Put(ctx, ids[1], valueRow(1)))
			leave := func(me, other uint64) func() {
				return func() {
					okOrConflict(t, db.Update(ctx, func(tx *Tx) error {
						a, b, err := getPair(tx, tb, me, other)
						if err != nil {
							return err
						}
						if valueOf(t, a)+valueOf(t, b) < 2 {
							return nil // the other one left: stay
						}
						return tx.Put(tb, me, valueRow(0))
					}))
				}
			}
			race(leave(ids[0], ids[1]), leave(ids[1], ids[0]))
			a, b := make([]byte, 64), make([]byte, 64)
			require.NoError(t, tb.Get(ctx, ids[0], a))
			require.NoError(t, tb.Get(ctx, ids[1], b))
			require.GreaterOrEqual(t, valueOf(t, a)+valueOf(t, b), int64(1), "round %d: both left", round)
		}
	})
}

func TestSerialLostUpdate(t *testing.T) {
	workers, incs := 8, 100
	if testing.Short() {
		workers, incs = 4, 50
	}
	eachConfig(t, serialConfigs(t), Options{}, func(t *testing.T, db *DB) {
		ctx := context.Background()
		tb := newTable(t, ctx, db, "counter", 64)
		id := insertRows(t, db, tb, 1)[0]
		require.NoError(t, tb.Put(ctx, id, valueRow(0)))
		var committed atomic.Int64
		var fns []func()
		for w := range workers {
			fns = append(fns, func() {
				buf := make([]byte, 64)
				for i := range incs {
					var err error
					if (w+i)%2 == 0 { // a read-modify-write transaction
						err = db.Update(ctx, func(tx *Tx) error {
							if err := tx.Get(tb, id, buf); err != nil {
								return err
							}
							return tx.Put(tb, id, valueRow(valueOf(t, buf)+1))
						})
					} else { // the single-row closure
						err = tb.Update(ctx, id, func(row []byte) error {
							fillRow(row, uint64(valueOf(t, row)+1))
							return nil
						})
					}
					if okOrConflict(t, err) {
						committed.Add(1)
					}
				}
			})
		}
		race(fns...)
		buf := make([]byte, 64)
		require.NoError(t, tb.Get(ctx, id, buf))
		require.Equal(t, committed.Load(), valueOf(t, buf), "increments lost")
	})
}

// TestSerialReadOnlyAnomaly: checking x and savings y start at 0. T1 deposits 20 into
// savings. T2 withdraws 10 from checking and, if x+y would go negative, charges 1 more. T3
// only reads x and y. Under snapshot isolation T3 can see y = 20 and x = 0 (T1 but not T2)
// while T2 did not see T1 (x = -11): no serial order explains that.
func TestSerialReadOnlyAnomaly(t *testing.T) {
	eachConfig(t, serialConfigs(t), Options{}, func(t *testing.T, db *DB) {
		ctx := context.Background()
		tb, ids := newTableRows(t, ctx, db, "accts", 2)
		x, y := ids[0], ids[1]
		anomalies := 0
		for round := range serialRounds() {
			require.NoError(t, tb.Put(ctx, x, valueRow(0)))
			require.NoError(t, tb.Put(ctx, y, valueRow(0)))
			t1 := func() {
				okOrConflict(t, db.Update(ctx, func(tx *Tx) error {
					buf := make([]byte, 64)
					if err := tx.Get(tb, y, buf); err != nil {
						return err
					}
					return tx.Put(tb, y, valueRow(valueOf(t, buf)+20))
				}))
			}
			t2 := func() {
				okOrConflict(t, db.Update(ctx, func(tx *Tx) error {
					a, b, err := getPair(tx, tb, x, y)
					if err != nil {
						return err
					}
					nx := valueOf(t, a) - 10
					if nx+valueOf(t, b) < 0 {
						nx--
					}
					return tx.Put(tb, x, valueRow(nx))
				}))
			}
			var sawX, sawY int64
			var t3ok bool
			t3 := func() {
				byScan := round%2 == 0
				t3ok = okOrConflict(t, db.View(ctx, func(tx *Tx) error {
					if byScan {
						for r, err := range tx.Scan(tb, x, y+1) {
							if err != nil {
								return err
							}
							if r.ID == x {
								sawX = valueOf(t, r.Data)
							} else {
								sawY = valueOf(t, r.Data)
							}
						}
						return nil
					}
					a, b, err := getPair(tx, tb, x, y)
					if err != nil {
						return err
					}
					sawX, sawY = valueOf(t, a), valueOf(t, b)
					return nil
				}))
			}
			race(t1, t2, t3)
			buf := make([]byte, 64)
			require.NoError(t, tb.Get(ctx, x, buf))
			finalX := valueOf(t, buf)
			if t3ok && sawX == 0 && sawY == 20 && finalX == -11 {
				anomalies++
			}
		}
		require.Zero(t, anomalies, "read-only anomalies")
	})
}

// TestSerialPhantomInsertIfEmpty: transactions race to insert into a fresh table if it is
// empty, by Tx.Scan; and, on a table whose first id grant is used up, to insert if no row
// lies past the high-water mark (the insert needs a new grant), by Tx.Scan and by Tx.Get of
// the ids of the next page. Exactly one may commit each time.
func TestSerialPhantomInsertIfEmpty(t *testing.T) {
	const racers, retries = 4, 8 // ids taken in a round: at most 36, all in the next page
	eachConfig(t, serialConfigs(t), Options{MaxRetries: retries}, func(t *testing.T, db *DB) {
		ctx := context.Background()
		for round := range serialRounds() {
			variant := round % 3
			tb, err := db.CreateTable(ctx, fmt.Sprintf("p%d", round), 64)
			require.NoError(t, err)
			var lo uint64
			if variant > 0 {
				ids := insertRows(t, db, tb, 64) // the first grant is one page
				lo = ids[63] + 1
				require.Equal(t, lo, tb.t.idHigh.Load(), "the grant is used up")
			}
			var committed atomic.Int32
			var fns []func()
			for range racers {
				fns = append(fns, func() {
					err := db.Update(ctx, func(tx *Tx) error {
						if variant == 2 {
							// By Get of each id of the next page (every insert of the
							// round lands there: at most racers*(MaxRetries+1) ids).
							buf := make([]byte, 64)
							for id := lo; id < lo+64; id++ {
								err := tx.Get(tb, id, buf)
								if err == nil {
									return nil
								}
								if !errors.Is(err, ErrNotFound) {
									return err
								}
							}
						} else {
							for _, err := range tx.Scan(tb, lo, 1<<40) {
								if err != nil {
									return err
								}
								return nil // not empty
							}
						}
						_, err := tx.Insert(tb, valueRow(1))
						return err
					})
					okOrConflict(t, err)
				})
			}
			race(fns...)
			n := 0
			for _, err := range tb.Scan(ctx, lo, 1<<40) {
				require.NoError(t, err)
				n++
			}
			committed.Store(int32(n))
			require.Equal(t, int32(1), committed.Load(), "round %d (variant %d): rows past %d", round, variant, lo)
		}
	})
}

// TestSerialPhantomInsertIfFewer: transactions insert a row only if the table holds fewer
// than K; the table must end with exactly K rows.
func TestSerialPhantomInsertIfFewer(t *testing.T) {
	const k = 10
	workers, tries := 6, 6
	eachConfig(t, serialConfigs(t), Options{}, func(t *testing.T, db *DB) {
		ctx := context.Background()
		rounds := max(serialRounds()/5, 4)
		for round := range rounds {
			tb, err := db.CreateTable(ctx, fmt.Sprintf("k%d", round), 64)
			require.NoError(t, err)
			var fns []func()
			for range workers {
				fns = append(fns, func() {
					for range tries {
						okOrConflict(t, db.Update(ctx, func(tx *Tx) error {
							n := 0
							for _, err := range tx.Scan(tb, 0, 1<<40) {
								if err != nil {
									return err
								}
								n++
							}
							if n >= k {
								return nil
							}
							_, err := tx.Insert(tb, valueRow(int64(n)))
							return err
						}))
					}
				})
			}
			race(fns...)
			n := 0
			for _, err := range tb.Scan(ctx, 0, 1<<40) {
				require.NoError(t, err)
				n++
			}
			require.Equal(t, k, n, "round %d", round)
		}
	})
}

// TestSerialBankAuditors: random transfers among accounts while auditors sum every balance,
// in View by Get and in a transaction by Tx.Scan: every audit that commits sees the opening
// total, and so does the end.
func TestSerialBankAuditors(t *testing.T) {
	accounts, workers, run := 256, 8, time.Second
	if testing.Short() {
		accounts, workers, run = 128, 4, 300*time.Millisecond
	}
	const opening = 100
	eachConfig(t, serialConfigs(t), Options{}, func(t *testing.T, db *DB) {
		ctx := context.Background()
		tb := newTable(t, ctx, db, "bank", 64)
		var ids []uint64
		require.NoError(t, db.Update(ctx, func(tx *Tx) error {
			for range accounts {
				id, err := tx.Insert(tb, valueRow(opening))
				if err != nil {
					return err
				}
				ids = append(ids, id)
			}
			return nil
		}))
		lo, hi := ids[0], ids[len(ids)-1]+1
		total := int64(accounts * opening)
		end := time.Now().Add(run) // how long to run, not a synchronisation
		var transfers, audits atomic.Int64
		var fns []func()
		for w := range workers {
			fns = append(fns, func() {
				rng := rand.New(rand.NewPCG(uint64(w), 7))
				a, b := make([]byte, 64), make([]byte, 64)
				for time.Now().Before(end) && !t.Failed() {
					from, to := ids[rng.IntN(len(ids))], ids[rng.IntN(len(ids))]
					if from == to {
						continue
					}
					amount := int64(1 + rng.IntN(20))
					err := db.Update(ctx, func(tx *Tx) error {
						if err := getTwo(tx, tb, from, to, a, b); err != nil {
							return err
						}
						if valueOf(t, a) < amount {
							return nil
						}
						if err := tx.Put(tb, from, valueRow(valueOf(t, a)-amount)); err != nil {
							return err
						}
						return tx.Put(tb, to, valueRow(valueOf(t, b)+amount))
					})
					if okOrConflict(t, err) {
						transfers.Add(1)
					}
				}
			})
		}
		audit := func(byScan bool) func() {
			return func() {
				buf := make([]byte, 64)
				for time.Now().Before(end) && !t.Failed() {
					var sum int64
					var n int
					err := db.View(ctx, func(tx *Tx) error {
						sum, n = 0, 0
						if byScan {
							for r, err := range tx.Scan(tb, lo, hi) {
								if err != nil {
									return err
								}
								sum += valueOf(t, r.Data)
								n++
							}
							return nil
						}
						for _, id := range ids {
							if err := tx.Get(tb, id, buf); err != nil {
								return err
							}
							sum += valueOf(t, buf)
							n++
						}
						return nil
					})
					if okOrConflict(t, err) {
						audits.Add(1)
						if sum != total || n != accounts {
							t.Errorf("audit (scan %v) saw %d accounts summing to %d, want %d summing to %d", byScan, n, sum, accounts, total)
							return
						}
					}
				}
			}
		}
		fns = append(fns, audit(false), audit(true))
		race(fns...)
		var sum int64
		for r, err := range tb.Scan(ctx, lo, hi) {
			require.NoError(t, err)
			sum += valueOf(t, r.Data)
		}
		require.Equal(t, total, sum)
		t.Logf("%d transfers, %d audits", transfers.Load(), audits.Load())
	})
}
