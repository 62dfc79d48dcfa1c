package server

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/sgio"
)

// TestTxnDecisionsNotFilledByPhantomParticipants: the guard of issue 22 defect 5 records a
// commit only for a part prepared here, by the deciding owner: so a client prepares a part
// of its own (this node its primary), decides commit naming 64 participants and applies its
// part. The 63 participants that do not exist never report, so the commit decision is kept
// for ever (a commit is forgotten only once every participant reported; it is carried by
// every checkpoint). MaxTxns rounds of that (one owner id, its own table, a few ms each)
// fill the decisions table: every real coordinator's Decide is then refused with
// ErrTxnBusy, for good, restarts included.
//
// What should happen: a client cannot fill the decisions kept: decisions count against the
// deciding owner's bounds (as its prepared parts do), or a commit whose participants never
// prepared anywhere is not kept beyond a bound of time, so another owner's Decide succeeds.
// So: kept decisions count against the owner of the part they were recorded for, at most
// MaxTxnsPerOwner (storenode's txn_decisions.go): the attacker's Decides past it are refused
// (ErrBusy), its part then aborted, and the victim's Decide succeeds. (Owner ids a client
// makes up are the per-owner bounds' own defect, 5.) Fails on d707e6a: the victim's Decide
// gets ErrTxnBusy.
func TestTxnDecisionsNotFilledByPhantomParticipants(t *testing.T) {
	const maxTxns, perOwner = 16, 4
	env := startQuotaServer(t, maxTxns, perOwner)
	ctx := srvCtx(t)
	const attacker = testOwner + 100
	c := env.dial(attacker)
	ti, g := srvTable(t, c, "mine", attacker)
	seq := g.LastSeq
	for i := range maxTxns {
		seq++
		txn := [16]byte{0xd5, byte(i)}
		m := srvCommit(ti.Table, attacker, g.Epoch, seq, []uint64{uint64(i)}, 1)
		_, err := c.PrepareTxn(ctx, &sgio.TxnPrepare{Txn: txn, Lease: 99, Commit: *m})
		require.NoError(t, err)
		d, err := c.DecideTxn(ctx, txn, 99, sgio.TxnCommit, 64)
		if i >= perOwner {
			require.ErrorIs(t, err, sgio.ErrBusy, "round %d: past the owner's kept decisions", i)
			require.NoError(t, c.ApplyTxn(ctx, txn, sgio.TxnAbort))
			continue
		}
		require.NoError(t, err)
		require.Equal(t, sgio.TxnCommit, d)
		require.NoError(t, c.ApplyTxn(ctx, txn, sgio.TxnCommit))
	}

	v := env.dial(testOwner)
	vt, vg := srvTable(t, v, "bank", testOwner)
	txn := [16]byte{0x77}
	m := srvCommit(vt.Table, testOwner, vg.Epoch, vg.LastSeq+1, []uint64{1}, 1)
	_, err := v.PrepareTxn(ctx, &sgio.TxnPrepare{Txn: txn, Lease: 41, Commit: *m})
	require.NoError(t, err, "the victim's prepare")
	d, err := v.DecideTxn(ctx, txn, 41, sgio.TxnCommit, 1)
	require.NoError(t, err, "the victim's Decide: one client's phantom participants filled the decisions")
	require.Equal(t, sgio.TxnCommit, d)
}
