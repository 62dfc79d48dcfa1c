// Command lootdrop is a small game-server simulation on the embedded transaction node: players
// pick items up from the ground and drop them again, each move one multi-row transaction
// (delete the item from one table, insert it into the other, update the player's count),
// concurrently, for a few seconds. At the end it counts the items: every item is on the
// ground or in exactly one inventory, and every player's count matches its inventory. It
// exits 1 if not.
//
//	go run ./examples/lootdrop                      # embedded, in a temporary directory
//	go run ./examples/lootdrop -dir /tmp/loot       # embedded, kept (run again to go on)
//	go run ./examples/lootdrop -store host:port     # against a storage node
//	go run ./examples/lootdrop -store host:port -secret-file $WEFT_SECRET_FILE
//	                                                # one with secrets: a game server's is the clients'
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weftdb/weft/txnode"
)

// config is what the flags set.
type config struct {
	dir        string
	store      string
	secretFile string // the storage node's clients' secret (a game server's credential)
	players    int
	items      int
	duration   time.Duration
	cacheBytes int64
	writeBack  bool
	syncMode   string
}

func main() { os.Exit(lootdrop()) }

func lootdrop() int {
	var cfg config
	flag.StringVar(&cfg.dir, "dir", "", "directory of the embedded store (default: a temporary one, removed at exit)")
	flag.StringVar(&cfg.store, "store", "", "address (host:port) of a storage node to use instead of the embedded store")
	flag.StringVar(&cfg.secretFile, "secret-file", "", "file holding the storage node's clients' secret (a game server's: WEFT_SECRET_FILE of `weft cluster up`)")
	flag.IntVar(&cfg.players, "players", 64, "players, one goroutine each")
	flag.IntVar(&cfg.items, "items", 20000, "items on the ground at the start of a new world")
	flag.DurationVar(&cfg.duration, "duration", 3*time.Second, "how long the players play")
	flag.Int64Var(&cfg.cacheBytes, "cache", 8<<20, "page cache budget in bytes")
	flag.BoolVar(&cfg.writeBack, "writeback", false, "commit in WriteBack mode (flushed in epochs) instead of Durable")
	flag.StringVar(&cfg.syncMode, "sync", "always", "embedded store's WAL sync: always (survives power loss) or none")
	flag.Parse()

	if cfg.dir == "" && cfg.store == "" {
		dir, err := os.MkdirTemp("", "lootdrop-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "lootdrop:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		cfg.dir = dir
	}
	if err := run(context.Background(), cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "lootdrop:", err)
		return 1
	}
	return 0
}

// Rows, 64 bytes each, little-endian.
//
//	ground:    serial u64 | kind u32 | x f32 | y f32 | value u32 | zero
//	inventory: serial u64 | kind u32 | value u32 | owner u64 (player row id) | zero
//	players:   number u64 | items u64 | picks u64 | drops u64 | zero
const rowBytes = 64

type item struct {
	serial uint64 // 1..items, for ever: the item's identity
	kind   uint32
	value  uint32
}

func groundRow(it item, x, y float32) []byte {
	b := make([]byte, rowBytes)
	binary.LittleEndian.PutUint64(b[0:], it.serial)
	binary.LittleEndian.PutUint32(b[8:], it.kind)
	binary.LittleEndian.PutUint32(b[12:], math.Float32bits(x))
	binary.LittleEndian.PutUint32(b[16:], math.Float32bits(y))
	binary.LittleEndian.PutUint32(b[20:], it.value)
	return b
}

func fromGround(b []byte) item {
	return item{serial: binary.LittleEndian.Uint64(b[0:]), kind: binary.LittleEndian.Uint32(b[8:]), value: binary.LittleEndian.Uint32(b[20:])}
}

func inventoryRow(it item, owner uint64) []byte {
	b := make([]byte, rowBytes)
	binary.LittleEndian.PutUint64(b[0:], it.serial)
	binary.LittleEndian.PutUint32(b[8:], it.kind)
	binary.LittleEndian.PutUint32(b[12:], it.value)
	binary.LittleEndian.PutUint64(b[16:], owner)
	return b
}

func fromInventory(b []byte) (item, uint64) {
	return item{serial: binary.LittleEndian.Uint64(b[0:]), kind: binary.LittleEndian.Uint32(b[8:]), value: binary.LittleEndian.Uint32(b[12:])},
		binary.LittleEndian.Uint64(b[16:])
}

// world is the open database and its tables.
type world struct {
	db                         *txnode.DB
	ground, inventory, players *txnode.Table
	groundHigh                 atomic.Uint64 // one past the highest ground id seen
	items                      int           // items in the world
}

// result is what a run did and found.
type result struct {
	picks, drops, empty int64
	onGround, carried   int
	elapsed             time.Duration
}

// run plays one game and checks that the items are conserved. main and the test call it.
func run(ctx context.Context, cfg config, out io.Writer) error {
	opts := txnode.Options{Dir: cfg.dir, StoreAddr: cfg.store, CacheBytes: cfg.cacheBytes, SyncMode: cfg.syncMode}
	if cfg.store != "" {
		opts.Dir = ""
	}
	if cfg.secretFile != "" {
		b, err := os.ReadFile(cfg.secretFile)
		if err != nil {
			return fmt.Errorf("lootdrop: secret: %w", err)
		}
		opts.Secret = bytes.TrimSpace(b)
	}
	if cfg.writeBack {
		opts.Durability = txnode.WriteBack
	}
	db, err := txnode.Open(ctx, opts)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	defer db.Close(ctx)
	w := &world{db: db}
	if err := w.setUp(ctx, cfg); err != nil {
		return err
	}
	res, err := w.play(ctx, cfg)
	if err != nil {
		return err
	}
	if err := w.count(ctx, &res); err != nil {
		return err
	}
	st := db.Stats()
	moves := res.picks + res.drops
	fmt.Fprintf(out, "%d players, %v: %d pick-ups, %d drops (%.0f moves/s), %d looks found nothing; %d retries on conflict\n",
		cfg.players, res.elapsed.Round(time.Millisecond), res.picks, res.drops, float64(moves)/res.elapsed.Seconds(), res.empty, st.Retries)
	fmt.Fprintf(out, "items conserved: %d on the ground + %d carried = %d of %d\n", res.onGround, res.carried, res.onGround+res.carried, w.items)
	return db.Close(ctx)
}

// setUp creates the tables and scatters the items, or, on a store that has them, takes them
// as they are (a second run goes on with the first one's world).
func (w *world) setUp(ctx context.Context, cfg config) error {
	tables := []**txnode.Table{&w.ground, &w.inventory, &w.players}
	created := false
	for i, name := range []string{"ground", "inventory", "players"} {
		t, err := w.db.Table(ctx, name)
		if errors.Is(err, txnode.ErrTableNotFound) {
			t, err = w.db.CreateTable(ctx, name, rowBytes)
			created = true
		}
		if err != nil {
			return fmt.Errorf("table %s: %w", name, err)
		}
		*tables[i] = t
	}
	if !created {
		return w.load(ctx)
	}
	w.items = cfg.items
	rng := rand.New(rand.NewPCG(1, 2))
	for lo := 0; lo < cfg.items; lo += 1000 {
		err := w.db.Update(ctx, func(tx *txnode.Tx) error {
			for s := lo; s < min(lo+1000, cfg.items); s++ {
				it := item{serial: uint64(s + 1), kind: uint32(rng.IntN(50)), value: uint32(rng.IntN(1000))}
				id, err := tx.Insert(w.ground, groundRow(it, rng.Float32()*1000, rng.Float32()*1000))
				if err != nil {
					return err
				}
				w.noteGround(id)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("scatter items: %w", err)
		}
	}
	return w.db.Update(ctx, func(tx *txnode.Tx) error {
		for p := range cfg.players {
			b := make([]byte, rowBytes)
			binary.LittleEndian.PutUint64(b, uint64(p))
			if _, err := tx.Insert(w.players, b); err != nil {
				return err
			}
		}
		return nil
	})
}

func (w *world) noteGround(id uint64) {
	for {
		h := w.groundHigh.Load()
		if id < h || w.groundHigh.CompareAndSwap(h, id+1) {
			return
		}
	}
}

// load takes an existing world: its item count and the ground's high-water mark.
func (w *world) load(ctx context.Context) error {
	for r, err := range w.ground.Scan(ctx, 0, math.MaxUint64) {
		if err != nil {
			return err
		}
		w.noteGround(r.ID)
		w.items++
	}
	for _, err := range w.inventory.Scan(ctx, 0, math.MaxUint64) {
		if err != nil {
			return err
		}
		w.items++
	}
	return nil
}

// play runs the players until the time is up.
func (w *world) play(ctx context.Context, cfg config) (result, error) {
	var playerIDs []uint64
	for r, err := range w.players.Scan(ctx, 0, math.MaxUint64) {
		if err != nil {
			return result{}, err
		}
		playerIDs = append(playerIDs, r.ID)
	}
	if len(playerIDs) < cfg.players {
		return result{}, fmt.Errorf("%d players in the store, want %d", len(playerIDs), cfg.players)
	}
	// What each player carries, from a previous run.
	carried := make(map[uint64][]uint64)
	for r, err := range w.inventory.Scan(ctx, 0, math.MaxUint64) {
		if err != nil {
			return result{}, err
		}
		_, owner := fromInventory(r.Data)
		carried[owner] = append(carried[owner], r.ID)
	}

	var res result
	var picks, drops, empty atomic.Int64
	start := time.Now()
	deadline := start.Add(cfg.duration)
	errs := make(chan error, cfg.players)
	var wg sync.WaitGroup
	for p := range cfg.players {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pl := &player{w: w, id: playerIDs[p], inv: carried[playerIDs[p]], rng: rand.New(rand.NewPCG(uint64(p), uint64(start.UnixNano())))}
			for time.Now().Before(deadline) {
				var err error
				if len(pl.inv) > 0 && (len(pl.inv) >= 20 || pl.rng.IntN(2) == 0) {
					err = pl.drop(ctx)
					drops.Add(1)
				} else {
					var found bool
					found, err = pl.pickUp(ctx)
					if found {
						picks.Add(1)
					} else {
						empty.Add(1)
					}
				}
				if err != nil {
					errs <- fmt.Errorf("player %d: %w", p, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return res, err
	}
	res.picks, res.drops, res.empty = picks.Load(), drops.Load(), empty.Load()
	res.elapsed = time.Since(start)
	return res, nil
}

type player struct {
	w   *world
	id  uint64   // the player's row in players
	inv []uint64 // inventory rows it owns (only this player writes them)
	rng *rand.Rand
}

// pickUp looks at a random stretch of the ground and picks up the first item there: the item
// leaves the ground, enters the inventory, and the player's count goes up, atomically.
func (p *player) pickUp(ctx context.Context) (bool, error) {
	w := p.w
	lo := p.rng.Uint64N(max(w.groundHigh.Load(), 1))
	var invID uint64
	var found bool
	err := w.db.Update(ctx, func(tx *txnode.Tx) error {
		found = false
		var groundID uint64
		var it item
		for r, err := range tx.Scan(w.ground, lo, lo+64) {
			if err != nil {
				return err
			}
			groundID, it, found = r.ID, fromGround(r.Data), true
			break
		}
		if !found {
			return nil
		}
		if err := tx.Delete(w.ground, groundID); err != nil {
			return err
		}
		var err error
		if invID, err = tx.Insert(w.inventory, inventoryRow(it, p.id)); err != nil {
			return err
		}
		return tx.Update(w.players, p.id, func(row []byte) error {
			binary.LittleEndian.PutUint64(row[8:], binary.LittleEndian.Uint64(row[8:])+1)
			binary.LittleEndian.PutUint64(row[16:], binary.LittleEndian.Uint64(row[16:])+1)
			return nil
		})
	})
	if err != nil || !found {
		return false, err
	}
	p.inv = append(p.inv, invID)
	return true, nil
}

// drop puts a random carried item back on the ground somewhere.
func (p *player) drop(ctx context.Context) error {
	w := p.w
	k := p.rng.IntN(len(p.inv))
	invID := p.inv[k]
	x, y := p.rng.Float32()*1000, p.rng.Float32()*1000
	var groundID uint64
	err := w.db.Update(ctx, func(tx *txnode.Tx) error {
		row := make([]byte, rowBytes)
		if err := tx.Get(w.inventory, invID, row); err != nil {
			return err
		}
		it, owner := fromInventory(row)
		if owner != p.id {
			return fmt.Errorf("inventory row %d belongs to player row %d, not %d", invID, owner, p.id)
		}
		if err := tx.Delete(w.inventory, invID); err != nil {
			return err
		}
		var err error
		if groundID, err = tx.Insert(w.ground, groundRow(it, x, y)); err != nil {
			return err
		}
		return tx.Update(w.players, p.id, func(row []byte) error {
			binary.LittleEndian.PutUint64(row[8:], binary.LittleEndian.Uint64(row[8:])-1)
			binary.LittleEndian.PutUint64(row[24:], binary.LittleEndian.Uint64(row[24:])+1)
			return nil
		})
	})
	if err != nil {
		return err
	}
	p.inv[k] = p.inv[len(p.inv)-1]
	p.inv = p.inv[:len(p.inv)-1]
	w.noteGround(groundID)
	return nil
}

// count checks the world: every serial 1..items once, on the ground or in one inventory, and
// every player's count equal to the inventory rows it owns.
func (w *world) count(ctx context.Context, res *result) error {
	seen := make([]bool, w.items+1)
	note := func(serial uint64, where string) error {
		if serial == 0 || serial > uint64(w.items) {
			return fmt.Errorf("%s holds item %d, which never existed", where, serial)
		}
		if seen[serial] {
			return fmt.Errorf("item %d is in two places (again in %s)", serial, where)
		}
		seen[serial] = true
		return nil
	}
	owned := make(map[uint64]uint64)
	for r, err := range w.ground.Scan(ctx, 0, math.MaxUint64) {
		if err != nil {
			return err
		}
		if err := note(fromGround(r.Data).serial, "the ground"); err != nil {
			return err
		}
		res.onGround++
	}
	for r, err := range w.inventory.Scan(ctx, 0, math.MaxUint64) {
		if err != nil {
			return err
		}
		it, owner := fromInventory(r.Data)
		if err := note(it.serial, fmt.Sprintf("the inventory of player row %d", owner)); err != nil {
			return err
		}
		owned[owner]++
		res.carried++
	}
	for r, err := range w.players.Scan(ctx, 0, math.MaxUint64) {
		if err != nil {
			return err
		}
		if n := binary.LittleEndian.Uint64(r.Data[8:]); n != owned[r.ID] {
			return fmt.Errorf("player row %d counts %d items, carries %d", r.ID, n, owned[r.ID])
		}
	}
	if total := res.onGround + res.carried; total != w.items {
		return fmt.Errorf("items not conserved: %d on the ground + %d carried = %d, want %d", res.onGround, res.carried, total, w.items)
	}
	return nil
}
