package main

import (
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/weftdb/weft/sgio"
)

// cmdTxn lists or aborts the two-phase commit parts in doubt at a running storage node
// (docs/operations.md, "Transactions in doubt"):
//
//	weft --store ADDR txn list        the parts prepared longer than the node's TxnInDoubtAfter
//	weft --store ADDR txn abort TXN   abort one (TXN: the 32 hex digits the list prints)
//
// A part in doubt keeps its rows locked: its table can be neither acquired by another owner
// nor dropped until it is decided. Abort one only when its primary (the list's PRIMARY; "-"
// is the node itself, where the abort is recorded first and a recorded commit is refused) is
// lost for good: a part whose primary recorded commit, aborted here, breaks its transaction.
func cmdTxn(ctx context.Context, g *globals, args []string, stdout io.Writer) error {
	args, err := parseArgs(flag.NewFlagSet("txn", flag.ContinueOnError), args)
	if err != nil {
		return err
	}
	if len(args) == 0 {
		return fmt.Errorf("%w: say list or abort TXN", errUsage)
	}
	var id [sgio.TxnIDSize]byte
	switch {
	case args[0] == "list" && len(args) == 1:
	case args[0] == "abort" && len(args) == 2:
		b, err := hex.DecodeString(args[1])
		if err != nil || len(b) != sgio.TxnIDSize {
			return fmt.Errorf("%w: transaction id %q: want %d hex digits", errUsage, args[1], 2*sgio.TxnIDSize)
		}
		copy(id[:], b)
	default:
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, args)
	}
	switch {
	case g.dir != "":
		return fmt.Errorf("%w: txn asks a running storage node (--store): a stopped store's transactions are in doubt only once it runs", errUsage)
	case g.store == "":
		return fmt.Errorf("%w: say which storage node: --store ADDR (or $WEFT_STORE)", errUsage)
	}
	secret, err := g.secret()
	if err != nil {
		return err
	}
	c, err := sgio.Dial(ctx, sgio.ClientConfig{Addr: g.store, Secret: secret, Name: "weft-txn"})
	if err != nil {
		return fmt.Errorf("connect to %s: %w", g.store, err)
	}
	defer c.Close()
	if args[0] == "abort" {
		d, err := c.AbortInDoubt(ctx, id)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "aborted %s (owner %d, table %d, primary %s, in doubt for %v)\n",
			hex.EncodeToString(d.Txn[:]), d.Owner, d.Table, primaryName(d.Primary), age(d.AgeMillis))
		return nil
	}
	l, err := c.TxnsInDoubt(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "TXN\tOWNER\tTABLE\tAGE\tPRIMARY\tLEASE")
	for _, d := range l.Entries {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%v\t%s\t%d\n", hex.EncodeToString(d.Txn[:]), d.Owner, d.Table, age(d.AgeMillis),
			primaryName(d.Primary), d.Lease)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if n := int(l.Total) - len(l.Entries); n > 0 {
		fmt.Fprintf(stdout, "(%d more in doubt, not listed: the oldest %d are)\n", n, len(l.Entries))
	}
	return nil
}

func primaryName(p string) string {
	if p == "" {
		return "-"
	}
	return p
}

func age(ms uint64) time.Duration { return (time.Duration(ms) * time.Millisecond).Round(time.Second) }
