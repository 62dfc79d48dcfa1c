package server

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// startQuotaServer starts a server whose engine keeps at most maxTxns transactions, perOwner
// of them per owner, its leases checked by a txnLeases.
func startQuotaServer(t *testing.T, maxTxns, perOwner int) *srvEnv {
	return startServer(t, func(cfg *Config) {
		cfg.Options.MaxTxns = maxTxns
		cfg.Options.MaxTxnsPerOwner = perOwner
		cfg.Options.LeaseChecker = &txnLeases{}
	})
}

// TestTxnOwnerQuotaNotBypassedByOwnerIDs: the per-owner bounds on prepared parts (issue 22,
// defect 6: MaxTxnsPerOwner, so that one owner's transactions whose primary is unreachable
// cannot take the whole of MaxTxns) count owner ids, and a session's owner id was whatever
// its Hello claimed: one client credential connected as MaxTxns/MaxTxnsPerOwner made-up
// owner ids in turn (each creates and acquires a table of its own, prepares its quota of
// parts naming an unreachable primary, and leaves), and every other owner's prepare was
// then refused with ErrTxnBusy until an operator aborted them.
//
// What should happen: a game server holds its own owner's derived secret
// (sgio.DeriveOwnerSecret), which proves that owner id only: 16 owner ids need 16 secrets,
// the made-up ids are refused at authentication, the one owner's parts stop at its quota
// (ErrTxnBusy, which matches ErrBusy), and another owner's prepare succeeds. Fails on b3f6c9d: no derived secret is
// accepted (and with the shared clients' secret the victim's prepare gets ErrTxnBusy).
func TestTxnOwnerQuotaNotBypassedByOwnerIDs(t *testing.T) {
	const maxTxns, perOwner = 16, 4
	env := startQuotaServer(t, maxTxns, perOwner)
	ctx := srvCtx(t)
	const attacker = 1000
	for i := range maxTxns / perOwner {
		owner := uint64(attacker + i)
		c, err := env.tryDial(owner, asOwner(attacker))
		if i > 0 {
			require.ErrorIs(t, err, sgio.ErrAuthFailed, "owner id %d claimed with owner %d's secret", owner, attacker)
			continue
		}
		require.NoError(t, err)
		ti, g := srvTable(t, c, fmt.Sprintf("flood-%d", i), owner)
		for j := range perOwner + 1 {
			m := srvCommit(ti.Table, owner, g.Epoch, g.LastSeq+1+uint64(j), []uint64{uint64(j)}, 1)
			_, err := c.PrepareTxn(ctx, &sgio.TxnPrepare{Txn: [16]byte{0xf1, byte(i), byte(j)}, Lease: 99, Index: 1,
				Primary: "127.0.0.1:1", Commit: *m})
			if j == perOwner {
				require.ErrorIs(t, err, sgio.ErrBusy, "the owner's quota of prepared parts")
				require.ErrorIs(t, err, storenode.ErrTxnBusy, "the reason crosses TCP (code 25)")
				break
			}
			require.NoError(t, err)
		}
		require.NoError(t, c.Close())
	}

	v := env.dial(testOwner, asOwner(testOwner))
	ti, g := srvTable(t, v, "bank", testOwner)
	m := srvCommit(ti.Table, testOwner, g.Epoch, g.LastSeq+1, []uint64{1}, 1)
	_, err := v.PrepareTxn(ctx, &sgio.TxnPrepare{Txn: [16]byte{0x77}, Lease: 41, Commit: *m})
	require.NoError(t, err, "made-up owner ids took every prepared slot")
}
