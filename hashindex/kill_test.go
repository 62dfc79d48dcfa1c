package hashindex_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/hashindex"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/txnode"
)

// A kill -9 of a game process that keeps a players table and its unique name index in the
// same transactions: the test binary re-executes itself (TestHelperKillWriter) on the
// embedded store, the child inserts players (and deletes some) and prints each success, and
// the parent kills it at a random moment, three times. Then every acknowledged player is
// found by name with its id, every acknowledged delete is gone from both, and the index
// holds exactly one entry for each row of the table (whatever the kills did to the
// transactions in flight).

const killWriterEnv = "WEFT_HASHINDEX_KILL_WRITER"

// TestHelperKillWriter is not a test: it is the writer process of TestKill9.
func TestHelperKillWriter(t *testing.T) {
	spec := testkit.HelperSpec(t, killWriterEnv, "TestKill9")
	dir, rest, _ := strings.Cut(spec, "@")
	startStr, mode, _ := strings.Cut(rest, "@")
	start, err := strconv.Atoi(startStr)
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	opts := txnode.Options{Dir: dir, SyncMode: "none"}
	if mode == "writeback" {
		opts.Durability = txnode.WriteBack
		opts.FlushInterval = time.Millisecond // several epochs flushed before a kill
	}
	db, err := txnode.Open(ctx, opts)
	if err != nil {
		fail(err)
	}
	players, names, err := openPlayers(ctx, db)
	if err != nil {
		fail(err)
	}
	out := bufio.NewWriter(os.Stdout)
	ids := map[int]uint64{}
	for i := start; ; i++ {
		var id uint64
		del := i - 5
		delID, doDelete := ids[del]
		doDelete = doDelete && i%3 == 0
		err := db.Update(ctx, func(tx *txnode.Tx) error {
			var err error
			if id, err = tx.Insert(players, playerRow(i)); err != nil {
				return err
			}
			if err := names.TxInsert(tx, playerName(i), id); err != nil {
				return err
			}
			if doDelete {
				if err := tx.Delete(players, delID); err != nil {
					return err
				}
				return names.TxDelete(tx, playerName(del), delID)
			}
			return nil
		})
		if err != nil {
			fail(err)
		}
		ids[i] = id
		fmt.Fprintf(out, "inserted %d %d\n", i, id)
		if doDelete {
			fmt.Fprintf(out, "deleted %d\n", del)
		}
		out.Flush()
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "writer:", err)
	os.Exit(1)
}

func playerRow(i int) []byte {
	row := make([]byte, 64)
	copy(row, playerName(i))
	binary.LittleEndian.PutUint64(row[16:], uint64(i))
	return row
}

// openPlayers opens (creating) the players table and its name index.
func openPlayers(ctx context.Context, db *txnode.DB) (*txnode.Table, *hashindex.Index, error) {
	players, err := db.Table(ctx, "players")
	if err != nil {
		if players, err = db.CreateTable(ctx, "players", 64); err != nil {
			return nil, nil, err
		}
		names, err := hashindex.Create(ctx, db, "players.name", hashindex.Options{KeyBytes: 16, Unique: true, RowBytes: 64})
		return players, names, err
	}
	names, err := hashindex.Open(ctx, db, "players.name")
	return players, names, err
}

func TestKill9(t *testing.T) { killWriter(t, false) }

// TestKill9WriteBack is TestKill9 with a writer in WriteBack mode: a kill loses the commits
// of the unflushed epochs, acknowledged or not, so what survives of each round must be a
// prefix of its transactions (whole epochs, in order), and the index and the table must
// agree row for row whatever was lost.
func TestKill9WriteBack(t *testing.T) { killWriter(t, true) }

func killWriter(t *testing.T, writeBack bool) {
	ctx := context.Background()
	dir := t.TempDir()
	// Create the tables first, so a kill during creation is not part of the test.
	db := openDB(t, dir)
	defer db.Close(ctx) // idempotent: closed below, before the writer opens the directory
	_, _, err := openPlayers(ctx, db)
	require.NoError(t, err)
	require.NoError(t, db.Close(ctx))

	inserted := map[int]uint64{}
	deleted := map[int]bool{}
	maybeDeleted := map[int]bool{} // by the transaction in flight at a kill
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	rounds, most := 3, 400
	if testing.Short() {
		rounds, most = 2, 150
	}
	for round := range rounds {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperKillWriter$", "-test.v=false")
		mode := "durable"
		if writeBack {
			mode = "writeback"
		}
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s@%d@%s", killWriterEnv, dir, round*1_000_000, mode))
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		killAt := 20 + r.IntN(most)
		lines := make(chan string)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		timeout := time.After(30 * time.Second)
		acks := 0
	read:
		for {
			select {
			case line, ok := <-lines:
				if !ok {
					break read // the child ended on its own: an error it printed
				}
				var i int
				var id uint64
				if _, err := fmt.Sscanf(line, "inserted %d %d", &i, &id); err == nil {
					inserted[i] = id
					if acks++; acks == killAt {
						require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
					}
				} else if _, err := fmt.Sscanf(line, "deleted %d", &i); err == nil {
					deleted[i] = true
				}
			case <-timeout:
				cmd.Process.Kill()
				t.Fatalf("round %d: no kill after 30 s (%d acks)", round, acks)
			}
		}
		cmd.Wait()
		require.GreaterOrEqual(t, acks, killAt, "round %d: the writer died before it was killed", round)
		// The transaction after the last acknowledged one may have committed unacknowledged:
		// its insert is not checked (it has no ack), but its delete of player i-5 would hide
		// an acknowledged player.
		last := round*1_000_000 + acks - 1
		if next := last + 1; next%3 == 0 {
			maybeDeleted[next-5] = true
		}
	}

	db = openDB(t, dir)
	defer db.Close(ctx)
	players, names, err := openPlayers(ctx, db)
	require.NoError(t, err)
	st := verifyIndex(t, ctx, names)
	if writeBack {
		// What survived of each round: its acknowledged inserts up to the last surviving one
		// (a prefix), with the deletes of the transactions in it.
		last := map[int]int{} // round -> the highest surviving acknowledged player
		for i := range inserted {
			if _, err := names.Lookup(ctx, playerName(i)); err == nil && i > last[i/1_000_000]-1 {
				last[i/1_000_000] = i + 1
			}
		}
		lost := 0
		for i, id := range inserted {
			kept := i < last[i/1_000_000]
			if !kept || deleted[i] && i+5 < last[i/1_000_000] {
				_, err := names.Lookup(ctx, playerName(i))
				require.ErrorIs(t, err, hashindex.ErrNotFound, "player %d: lost or deleted", i)
				require.ErrorIs(t, players.Get(ctx, id, make([]byte, 64)), txnode.ErrNotFound, "player %d", i)
				if !kept {
					lost++
				}
				continue
			}
			if deleted[i] || maybeDeleted[i] {
				continue // its delete may or may not have survived; the row check below decides
			}
			got, err := names.Lookup(ctx, playerName(i))
			require.NoError(t, err, "player %d: in the surviving prefix", i)
			require.Equal(t, id, got, "player %d", i)
		}
		t.Logf("WriteBack: %d acknowledged inserts lost with their epochs", lost)
	}
	for i, id := range inserted {
		if writeBack {
			break // checked above
		}
		got, err := names.Lookup(ctx, playerName(i))
		if maybeDeleted[i] && errors.Is(err, hashindex.ErrNotFound) {
			require.ErrorIs(t, players.Get(ctx, id, make([]byte, 64)), txnode.ErrNotFound, "player %d is in the table, not the index", i)
			continue
		}
		if deleted[i] {
			require.ErrorIs(t, err, hashindex.ErrNotFound, "deleted player %d", i)
			require.ErrorIs(t, players.Get(ctx, id, make([]byte, 64)), txnode.ErrNotFound)
			continue
		}
		require.NoError(t, err, "player %d", i)
		require.Equal(t, id, got, "player %d", i)
	}
	// The index and the table agree row for row, the transactions in flight included.
	rows := 0
	for r, err := range players.ScanAll(ctx) {
		require.NoError(t, err)
		id, err := names.Lookup(ctx, r.Data[:16])
		require.NoError(t, err, "row %d", r.ID)
		require.Equal(t, r.ID, id)
		rows++
	}
	require.Equal(t, rows, st.Entries)
	t.Logf("%d acknowledged inserts, %d deletes, %d rows; index %+v", len(inserted), len(deleted), rows, st)
}
