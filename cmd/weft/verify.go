package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/weftdb/weft/storenode"
)

// Exit statuses of verify beside 0 (intact) and 2 (bad usage).
const (
	// exitDamaged: the check ran and found damage.
	exitDamaged = 1
	// exitUnchecked: the check could not run (the store is in use, not a store, unreadable).
	exitUnchecked = 3
)

// exitError makes run exit with code after printing err.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// cmdVerify checks a stopped store offline (storenode.Check) and prints every finding, then a
// summary. Damage exits 1; a check that cannot run (or is interrupted) exits 3. It runs without
// --timeout's default (a large store takes long to read); an explicit --timeout applies.
func cmdVerify(ctx context.Context, g *globals, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	maxFindings := fs.Int("max-findings", 1000, "print at most this many findings (the rest are counted)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	dir := g.dir
	switch {
	case g.store != "" && len(pos) == 0 && g.dir == "":
		return fmt.Errorf("%w: verify checks a stopped store's directory, not a storage node: weft verify DIR", errUsage)
	case len(pos) == 1 && g.dir == "":
		dir = pos[0]
	case len(pos) == 0 && g.dir != "":
	default:
		return fmt.Errorf("%w: verify takes one directory", errUsage)
	}
	rep, err := storenode.Check(ctx, dir, storenode.CheckOptions{MaxFindings: *maxFindings})
	if err != nil {
		return &exitError{code: exitUnchecked, err: err}
	}
	fmt.Fprintf(stdout, "checked %s: checkpoint LSN %d, synced LSN %d\n", rep.Dir, rep.CheckpointLSN, rep.SyncedLSN)
	for _, f := range rep.Findings {
		fmt.Fprintln(stdout, f.String())
	}
	if rep.Omitted > 0 {
		fmt.Fprintf(stdout, "... %d more findings not shown (--max-findings)\n", rep.Omitted)
	}
	notes := len(rep.Findings) + rep.Omitted - rep.DamageCount()
	state := "ok"
	if rep.Damaged() {
		state = fmt.Sprintf("DAMAGED (%d damage findings)", rep.DamageCount())
	}
	fmt.Fprintf(stdout, "%s: %d tables, %d pages (%d rows) checked in %d disk pages (%d free), %d WAL segments, %d records (%d bytes) through LSN %d, %d notes\n",
		state, rep.Tables, rep.Pages, rep.Rows, rep.DiskPages, rep.FreeDiskPages, rep.WALSegments, rep.WALRecords, rep.WALBytes, rep.LastLSN, notes)
	if rep.Damaged() {
		return &exitError{code: exitDamaged, err: fmt.Errorf("%s is damaged: %d damage findings", dir, rep.DamageCount())}
	}
	return nil
}
