// Command weft is Weft's command-line tool, like redis-cli or the bbolt CLI: it lists tables,
// reads rows and counters of a running storage node (--store) or of a stopped store's
// directory (--dir).
//
//	weft --store 127.0.0.1:7070 tables
//	weft --dir data get items 42 --layout 'kind:u32,owner:u64,name:str16'
//	weft --store 127.0.0.1:7070 scan items 0 1000
//	weft --store 127.0.0.1:7070 stats
//	weft verify data
//	weft --store 127.0.0.1:7070 backup --out /backups/weft-2026-12-01
//	weft cluster up --dir weft-cluster
//	weft --store 127.0.0.1:7070 txn list
//
// It reads as a client that owns no table: a storage node serves it durable rows only (a
// transaction node's cache may hold newer ones) and no game server loses ownership to it.
// A directory is opened in this process, which recovers it as a storage node's start would
// and fails while another process has it open. Rows print as hex, or as named fields with
// --layout (see layout.go for the types). backup copies a running storage node into a new
// directory while it commits, or a stopped store with --dir (backup.go; docs/operations.md,
// "Backup and restore"). Exit
// status: 0, 1 on an error, 2 on bad usage.
//
// verify checks a stopped store's directory offline (storenode.Check, like `bbolt check`)
// without changing a byte: the meta file, every page map against its data file, free pages,
// the WAL and the catalog. It prints one line per finding (file, offset, table, page, what is
// wrong with expected and found) and a summary, and exits 0 when the store is intact (notes,
// such as a torn WAL tail a crash left, do not count), 1 when it found damage, 3 when it could
// not check (the store is open in a running process, not a store, unreadable), 2 on bad usage.
//
// txn lists the two-phase commit parts in doubt at a running storage node, or aborts one
// (txn.go; docs/operations.md, "Transactions in doubt").
//
// cluster up runs a local cluster in this process until SIGINT or SIGTERM (cluster.go,
// package cluster/local): an embedded etcd and N storage nodes on loopback under --dir,
// printing the settings a game server needs (docs/cluster.md, "Running a local cluster").
package main

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// command is one sub-command: its usage line and what it does.
type command struct {
	name, args, help string
	run              func(ctx context.Context, g *globals, args []string, stdout io.Writer) error
}

// untimed names the commands that run without --timeout unless it is given: verify reads a
// whole store, cluster up runs until a signal.
var untimed = map[string]bool{"verify": true, "cluster": true}

var commands = []command{
	{"tables", "[--count]", "list the tables: id, name, row size, id high-water mark, rows", cmdTables},
	{"get", "TABLE ID [--layout L]", "print one row", cmdGet},
	{"scan", "TABLE [LO [HI]] [--layout L] [--limit N]", "print the rows with ids in [LO, HI) (the whole table by default), in id order", cmdScan},
	{"stats", "", "print the store's counters", cmdStats},
	{"verify", "DIR [--max-findings N]", "check a stopped store offline: every checksum, page maps, free pages, WAL (exit 1: damaged, 3: cannot check)", cmdVerify},
	{"backup", "--out DIR", "copy a running storage node (--store), commits going on, or a stopped store (--dir), into a new directory", cmdBackup},
	{"txn", "list | abort TXN", "list the two-phase commit parts in doubt at a storage node (--store), or abort one", cmdTxn},
	{"cluster", "up [--dir DIR] [--storage-nodes N] [--sync none]", "run a local cluster (etcd and N storage nodes on loopback) until Ctrl-C or SIGTERM", cmdCluster},
}

// globals are the flags before the command.
type globals struct {
	store      string
	dir        string
	secretFile string
	opFile     string // the operators' secret file
	timeout    time.Duration
}

// errUsage marks a command line that cannot be run; run prints the usage and exits 2.
var errUsage = errors.New("usage")

func usage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintln(w, "usage: weft (--store ADDR | --dir DIR) COMMAND [ARGS]")
	fmt.Fprintln(w, "       weft verify DIR")
	fmt.Fprintln(w, "       weft cluster up [--dir DIR] [--storage-nodes N] [--sync none] [--etcd-port P] [--port P]")
	fmt.Fprintln(w, "\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-7s %-42s %s\n", c.name, c.args, c.help)
	}
	fmt.Fprintln(w, "\nflags:")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fmt.Fprintln(w, "\nThe secret is read from the file --operator-secret-file or $WEFT_OPERATOR_SECRET_FILE names (an")
	fmt.Fprintln(w, "operator's: backups and weft txn need it), else from --secret-file or $WEFT_SECRET_FILE (a client's:")
	fmt.Fprintln(w, "reads only); the store is --store or $WEFT_STORE. weft cluster up's env file sets all three.")
	fmt.Fprintln(w, "A backup directory is a store: start a storage node (or txnode.Open) on it to restore; its")
	fmt.Fprintln(w, "first start bumps every table's epoch, so no transaction node keeps serving its old cache.")
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	g := &globals{}
	fs := flag.NewFlagSet("weft", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&g.store, "store", os.Getenv("WEFT_STORE"), "storage node address, host:port (default $WEFT_STORE)")
	fs.StringVar(&g.dir, "dir", "", "a stopped store's directory, read in this process")
	fs.StringVar(&g.secretFile, "secret-file", os.Getenv("WEFT_SECRET_FILE"), "file holding the storage node's clients' secret (default $WEFT_SECRET_FILE)")
	fs.StringVar(&g.opFile, "operator-secret-file", os.Getenv("WEFT_OPERATOR_SECRET_FILE"), "file holding the storage node's operators' secret, used before --secret-file (default $WEFT_OPERATOR_SECRET_FILE)")
	fs.DurationVar(&g.timeout, "timeout", time.Minute, "give up a command after this long")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(stdout, fs)
			return 0
		}
		fmt.Fprintf(stderr, "weft: %v\n", err)
		usage(stderr, fs)
		return 2
	}
	if fs.NArg() == 0 || fs.Arg(0) == "help" {
		usage(stdout, fs)
		if fs.NArg() == 0 {
			return 2
		}
		return 0
	}
	name := fs.Arg(0)
	for _, c := range commands {
		if c.name != name {
			continue
		}
		timed := !untimed[c.name]
		fs.Visit(func(f *flag.Flag) { timed = timed || f.Name == "timeout" })
		if timed {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, g.timeout)
			defer cancel()
		}
		err := c.run(ctx, g, fs.Args()[1:], stdout)
		var ee *exitError
		var help *helpRequest
		switch {
		case err == nil:
			return 0
		case errors.As(err, &help):
			fmt.Fprintf(stdout, "usage: weft %s %s\n%s\n", name, c.args, c.help)
			if hasFlags(help.fs) {
				fmt.Fprintln(stdout, "\nflags:")
				help.fs.SetOutput(stdout)
				help.fs.PrintDefaults()
			}
			return 0
		case errors.Is(err, errUsage):
			fmt.Fprintf(stderr, "weft %s: %v\nusage: weft %s %s\n", name, err, name, c.args)
			return 2
		case errors.As(err, &ee):
			fmt.Fprintf(stderr, "weft %s: %v\n", name, err)
			return ee.code
		default:
			fmt.Fprintf(stderr, "weft %s: %v\n", name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "weft: unknown command %q\n", name)
	usage(stderr, fs)
	return 2
}

// open returns the source the globals name.
func (g *globals) open(ctx context.Context) (source, error) {
	switch {
	case g.store != "" && g.dir != "":
		return nil, fmt.Errorf("%w: --store and --dir are exclusive", errUsage)
	case g.dir != "":
		return openLocalSource(g.dir)
	case g.store != "":
		secret, err := g.secret()
		if err != nil {
			return nil, err
		}
		return dialSource(ctx, g.store, secret)
	}
	return nil, fmt.Errorf("%w: say where the store is: --store ADDR (or $WEFT_STORE), or --dir DIR", errUsage)
}

// secret reads the secret weft dials with: the operators' (--operator-secret-file, default
// $WEFT_OPERATOR_SECRET_FILE), else the clients' (--secret-file, default $WEFT_SECRET_FILE);
// none is no secret. A storage node serves a client's secret reads only (docs/operations.md,
// "Roles and credentials"): a backup needs the operators'. Secrets are passed in files only,
// as to every Weft program: the secret itself in the environment is refused, not ignored.
func (g *globals) secret() ([]byte, error) {
	for _, env := range []string{"WEFT_SECRET", "WEFT_OPERATOR_SECRET"} {
		if os.Getenv(env) != "" {
			return nil, fmt.Errorf("$%s is not read: put the secret in a file (mode 0600) and name it with $%s_FILE or the flag", env, env)
		}
	}
	if s, err := readSecret("operator-secret-file", g.opFile); s != nil || err != nil {
		return s, err
	}
	return readSecret("secret-file", g.secretFile)
}

// readSecret reads the secret in file (of flag flag); nil when file is "".
func readSecret(flag, file string) ([]byte, error) {
	if file == "" {
		return nil, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return nil, fmt.Errorf("--%s %s: empty", flag, file)
	}
	return []byte(s), nil
}

// helpRequest is a command's -h or --help: run prints the command's usage and flags to
// stdout and exits 0.
type helpRequest struct{ fs *flag.FlagSet }

func (*helpRequest) Error() string { return "help requested" }

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

// parseArgs parses fs's flags wherever they stand among args and returns the positional
// arguments, so that `weft get items 42 --layout ...` works as well as flags first.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	fs.SetOutput(io.Discard)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, &helpRequest{fs: fs}
			}
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// parseNoArgs is parseArgs for a command that takes flags only: a positional argument is a
// usage error.
func parseNoArgs(fs *flag.FlagSet, args []string) error {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return fmt.Errorf("%w: %s takes no arguments", errUsage, fs.Name())
	}
	return nil
}

func parseID(s, what string) (uint64, error) {
	v, err := strconv.ParseUint(s, 0, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %s %q: want a row id", errUsage, what, s)
	}
	return v, nil
}

func cmdTables(ctx context.Context, g *globals, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("tables", flag.ContinueOnError)
	count := fs.Bool("count", false, "count the rows of each table (a storage node does not report them: one page-directory pass per table)")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	src, err := g.open(ctx)
	if err != nil {
		return err
	}
	defer src.Close()
	ts, err := src.Tables(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%-6s %-24s %6s %14s %14s\n", "id", "name", "row", "next id", "rows")
	for _, t := range ts {
		if t.Rows == rowsUnknown && *count {
			if t.Rows, err = countRows(ctx, src, t); err != nil {
				return fmt.Errorf("count %q: %w", t.Name, err)
			}
		}
		rows := "-"
		if t.Rows != rowsUnknown {
			rows = strconv.FormatUint(t.Rows, 10)
		}
		fmt.Fprintf(stdout, "%-6d %-24s %6d %14d %14s\n", t.ID, t.Name, t.RowBytes, t.NextID, rows)
	}
	return nil
}

// rowPrinter prints rows as "id<TAB>hex" or "id<TAB>fields".
type rowPrinter struct {
	w      io.Writer
	layout *layout
	line   []byte
}

func newRowPrinter(w io.Writer, spec string, rowBytes int) (*rowPrinter, error) {
	p := &rowPrinter{w: w}
	if spec != "" {
		l, err := parseLayout(spec, rowBytes)
		if err != nil {
			return nil, err
		}
		p.layout = l
	}
	return p, nil
}

func (p *rowPrinter) print(id uint64, row []byte) error {
	p.line = strconv.AppendUint(p.line[:0], id, 10)
	p.line = append(p.line, '\t')
	if p.layout != nil {
		p.line = p.layout.format(p.line, row)
	} else {
		p.line = hex.AppendEncode(p.line, row)
	}
	p.line = append(p.line, '\n')
	_, err := p.w.Write(p.line)
	return err
}

func cmdGet(ctx context.Context, g *globals, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("get", flag.ContinueOnError)
	spec := fs.String("layout", "", "decode the row into fields, instead of hex: "+layoutHelp)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return fmt.Errorf("%w: get takes a table and an id", errUsage)
	}
	id, err := parseID(pos[1], "id")
	if err != nil {
		return err
	}
	src, err := g.open(ctx)
	if err != nil {
		return err
	}
	defer src.Close()
	t, err := findTable(ctx, src, pos[0])
	if err != nil {
		return err
	}
	p, err := newRowPrinter(stdout, *spec, t.RowBytes)
	if err != nil {
		return err
	}
	row, err := getRow(ctx, src, t, id)
	if err != nil {
		return err
	}
	return p.print(id, row)
}

// errLimit stops a scan at --limit rows.
var errLimit = errors.New("limit reached")

func cmdScan(ctx context.Context, g *globals, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("scan", flag.ContinueOnError)
	spec := fs.String("layout", "", "decode each row into fields, instead of hex: "+layoutHelp)
	limit := fs.Uint64("limit", 0, "stop after this many rows (0: no limit)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 1 || len(pos) > 3 {
		return fmt.Errorf("%w: scan takes a table and an optional id range", errUsage)
	}
	lo, hi := uint64(0), ^uint64(0)
	if len(pos) > 1 {
		if lo, err = parseID(pos[1], "LO"); err != nil {
			return err
		}
	}
	if len(pos) > 2 {
		if hi, err = parseID(pos[2], "HI"); err != nil {
			return err
		}
		if hi < lo {
			return fmt.Errorf("%w: LO %d is above HI %d: the range is [LO, HI), ids LO <= id < HI", errUsage, lo, hi)
		}
	}
	src, err := g.open(ctx)
	if err != nil {
		return err
	}
	defer src.Close()
	t, err := findTable(ctx, src, pos[0])
	if err != nil {
		return err
	}
	hi = min(hi, t.NextID) // no row lives at or above the high-water mark
	p, err := newRowPrinter(stdout, *spec, t.RowBytes)
	if err != nil {
		return err
	}
	var n uint64
	err = scanRows(ctx, src, t, lo, hi, func(id uint64, row []byte) error {
		if *limit > 0 && n == *limit {
			return errLimit
		}
		n++
		return p.print(id, row)
	})
	if errors.Is(err, errLimit) {
		return nil
	}
	return err
}

func cmdStats(ctx context.Context, g *globals, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("stats", flag.ContinueOnError)
	verbose := fs.Bool("v", false, "print what each stat counts beside it")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	src, err := g.open(ctx)
	if err != nil {
		return err
	}
	defer src.Close()
	stats, err := src.Stats(ctx)
	if err != nil {
		return err
	}
	writeStats(stdout, stats, *verbose)
	return nil
}

// statInfo is what weft knows of a stat by its wire name: the engine's and the server's.
type statInfo struct {
	kind storenode.StatKind
	help string
}

func knownStats() map[string]statInfo {
	known := map[string]statInfo{}
	for _, d := range storenode.StatDescs() {
		known[d.WireName()] = statInfo{d.Kind, d.Help}
	}
	for _, d := range server.StatDescs() {
		known[d.WireName()] = statInfo{d.Kind, d.Help}
	}
	return known
}

// writeStats prints the counters (since the store was opened: zero after every restart, and
// WAL replay does not count), then the levels now, each under a header line starting with #;
// a stat this weft does not know (a newer node's) is printed with the levels.
func writeStats(w io.Writer, stats []base.Stat, verbose bool) {
	known := knownStats()
	width := 0 // the names' column fits the longest (checkpoint_last_duration_ns is 27)
	for _, s := range stats {
		width = max(width, len(s.Name))
	}
	section := func(header string, counters bool) {
		fmt.Fprintln(w, header)
		for _, s := range stats {
			info, ok := known[s.Name]
			if (ok && info.kind == storenode.StatCounter) != counters {
				continue
			}
			if verbose && info.help != "" {
				fmt.Fprintf(w, "%-*s %d\t%s\n", width, s.Name, s.Value, info.help)
				continue
			}
			fmt.Fprintf(w, "%-*s %d\n", width, s.Name, s.Value)
		}
	}
	section("# counters, since the store was opened (a restart starts them at zero; WAL replay is not counted)", true)
	section("# levels, now", false)
}
