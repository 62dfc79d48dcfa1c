package server

import (
	"encoding/base64"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// The roles of the secrets (roles.go; docs/operations.md, "Roles and credentials"): a
// request outside the caller's role is refused with ErrForbidden before it touches state.

// TestRolesClientRefusedOutsideItsRole: a client's secret (a game server's, leaked to a
// player) cannot back up, ask or report as a resolver, or step or write a move; each is
// ErrForbidden, counted, and the connection lives on. Fails on b3f6c9d (each was served).
func TestRolesClientRefusedOutsideItsRole(t *testing.T) {
	env := startServer(t)
	ctx := srvCtx(t)
	c := env.dial(testOwner)
	ti, _ := srvTableWithRow(t, ctx, c, "t", 1)

	var chunk sgio.BackupChunk
	require.ErrorIs(t, c.CallInto(ctx, &sgio.Backup{}, &chunk), sgio.ErrForbidden, "Backup")
	_, err := c.AskTxn(ctx, [16]byte{1}, 1)
	require.ErrorIs(t, err, sgio.ErrForbidden, "TxnAsk")
	require.ErrorIs(t, c.ReportTxn(ctx, [16]byte{1}, 0), sgio.ErrForbidden, "TxnReport")
	_, err = c.MoveStep(ctx, &sgio.Move{Op: sgio.MoveOpFreeze, Table: ti.Table, Token: 1 << 62})
	require.ErrorIs(t, err, sgio.ErrForbidden, "Move")
	_, err = c.WriteMove(ctx, &sgio.MoveWrite{Commit: *srvCommit(ti.Table, 1, 1, 1, []uint64{2}, 1)})
	require.ErrorIs(t, err, sgio.ErrForbidden, "MoveWrite")
	require.Equal(t, uint64(5), env.srv.Stats().ForbiddenRequests)

	require.NoError(t, c.CallInto(ctx, &sgio.Ping{}, &sgio.Pong{}), "the connection lives on")
	n, _ := env.srv.Engine().BackupHold()
	require.Zero(t, n, "no backup started")
}

// TestRolesClientCannotAbortAnotherOwnersPart (issue 22, defect 4): a client that learned a
// transaction id sends TxnApply{abort} to one participant between prepare and decide. The
// part is another owner's: refused with ErrForbidden, untouched, and the coordinator's
// commit applies on both participants (the transfer's total is kept). Fails on b3f6c9d: the
// abort applied, the coordinator's apply there got ErrTxnDecided, the total dropped by the
// amount.
func TestRolesClientCannotAbortAnotherOwnersPart(t *testing.T) {
	leases, clock := &txnLeases{}, &fakeClock{}
	a, b := startTxnNode(t, leases, clock), startTxnNode(t, leases, clock)
	ctx := srvCtx(t)
	for _, n := range []*txnNode{a, b} {
		require.NoError(t, n.coord.CallInto(ctx, n.commit(1, 1000), &sgio.CommitAck{}))
	}
	txn := [16]byte{0x5a, 1}
	_, err := a.coord.PrepareTxn(ctx, &sgio.TxnPrepare{Txn: txn, Lease: 41, Index: 0, Commit: *a.commit(1, 990)})
	require.NoError(t, err)
	_, err = b.coord.PrepareTxn(ctx, &sgio.TxnPrepare{Txn: txn, Lease: 41, Index: 1, Primary: a.env.addr, Commit: *b.commit(1, 1010)})
	require.NoError(t, err)

	attacker := b.env.dial(testOwner + 1)
	require.ErrorIs(t, attacker.ApplyTxn(ctx, txn, sgio.TxnAbort), sgio.ErrForbidden)
	require.ErrorIs(t, b.env.dial(0).ApplyTxn(ctx, txn, sgio.TxnAbort), sgio.ErrForbidden, "a client of no owner id")
	require.True(t, b.eng().TxnStatus(txn).Prepared, "the part is untouched")

	d, err := a.coord.DecideTxn(ctx, txn, 41, sgio.TxnCommit, 2)
	require.NoError(t, err)
	require.Equal(t, sgio.TxnCommit, d)
	require.NoError(t, a.coord.ApplyTxn(ctx, txn, sgio.TxnCommit))
	require.NoError(t, b.coord.ApplyTxn(ctx, txn, sgio.TxnCommit), "the coordinator applies its own part")
	require.Equal(t, uint64(2000), a.balance(t, 1)+b.balance(t, 1), "the transfer is whole")
}

// TestRolesOperatorApplyNotPeers: an operator's TxnApply reaches any part; a peer sends none
// (a resolver asks and reports, it applies the decision in its own engine), so a peer's is
// Forbidden: a peer's session, had a client obtained one (review defect 1), decides nothing.
// Fails on b3f6c9d: the peer's TxnApply aborted the part.
func TestRolesOperatorApplyNotPeers(t *testing.T) {
	leases, clock := &txnLeases{}, &fakeClock{}
	a := startTxnNode(t, leases, clock)
	ctx := srvCtx(t)
	leases.addNode("127.0.0.1:1")
	txn := [16]byte{0x5b}
	_, err := a.coord.PrepareTxn(ctx, &sgio.TxnPrepare{Txn: txn, Lease: 41, Index: 1, Primary: "127.0.0.1:1", Commit: *a.commit(1, 5)})
	require.NoError(t, err)
	require.ErrorIs(t, a.env.dial(0, asPeer).ApplyTxn(ctx, txn, sgio.TxnAbort), sgio.ErrForbidden)
	require.True(t, a.eng().TxnStatus(txn).Prepared, "still prepared")
	require.NoError(t, a.env.dial(0, asOperator).ApplyTxn(ctx, txn, sgio.TxnAbort))
	require.Equal(t, base.DecisionAbort, a.eng().TxnStatus(txn).Applied)
}

// TestRolesClientCannotDropAnotherOwnersTable: a table another owner held (its lease
// released) is an operator's to drop, not a client's; a client drops its own tables and
// tables nobody ever held. Fails on b3f6c9d: any client dropped the released table.
func TestRolesClientCannotDropAnotherOwnersTable(t *testing.T) {
	env := startServer(t)
	ctx := srvCtx(t)
	a := env.dial(testOwner)
	srvTable(t, a, "a", testOwner)
	require.NoError(t, a.CallInto(ctx, &sgio.Release{Owner: testOwner}, &sgio.OK{}))

	b := env.dial(testOwner + 1)
	require.ErrorIs(t, b.CallInto(ctx, &sgio.DropTable{Name: "a"}, &sgio.OK{}), sgio.ErrForbidden)
	require.ErrorIs(t, env.dial(0).CallInto(ctx, &sgio.DropTable{Name: "a"}, &sgio.OK{}), sgio.ErrForbidden, "a client of no owner id")
	_, err := env.srv.Engine().OpenTable("a")
	require.NoError(t, err, "still there")

	srvTable(t, b, "b", testOwner+1)
	require.NoError(t, b.CallInto(ctx, &sgio.DropTable{Name: "b"}, &sgio.OK{}), "its own table")
	require.NoError(t, b.CallInto(ctx, &sgio.CreateTable{Name: "never-held", RowBytes: 64}, &sgio.TableInfo{}))
	require.NoError(t, b.CallInto(ctx, &sgio.DropTable{Name: "never-held"}, &sgio.OK{}), "a table nobody held")

	require.NoError(t, env.dial(0, asOperator).CallInto(ctx, &sgio.DropTable{Name: "a"}, &sgio.OK{}), "an operator's drop")
}

// TestRolesPeerIsNoClient: a peer's secret (a storage node's) cannot act as a client: no
// table, commit or read; it may ping, read stats, ask and report.
func TestRolesPeerIsNoClient(t *testing.T) {
	env := startServer(t)
	ctx := srvCtx(t)
	c := env.dial(testOwner)
	ti, g := srvTable(t, c, "t", testOwner)
	require.NoError(t, c.Close())

	p := env.dial(testOwner, asPeer)
	require.ErrorIs(t, p.CallInto(ctx, srvCommit(ti.Table, testOwner, g.Epoch, g.LastSeq+1, []uint64{1}, 1), &sgio.CommitAck{}), sgio.ErrForbidden, "Commit")
	require.ErrorIs(t, p.CallInto(ctx, &sgio.CreateTable{Name: "p", RowBytes: 64}, &sgio.TableInfo{}), sgio.ErrForbidden, "CreateTable")
	require.ErrorIs(t, p.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Owner: testOwner}, &sgio.Grant{}), sgio.ErrForbidden, "Acquire")
	require.ErrorIs(t, p.CallInto(ctx, &sgio.ReadPages{Wants: []base.PageWant{{Table: ti.Table}}}, &sgio.Segments{}), sgio.ErrForbidden, "ReadPages")
	require.ErrorIs(t, p.CallInto(ctx, &sgio.DropTable{Name: "t"}, &sgio.OK{}), sgio.ErrForbidden, "DropTable")
	require.ErrorIs(t, p.CallInto(ctx, &sgio.Backup{}, &sgio.BackupChunk{}), sgio.ErrForbidden, "Backup")

	require.NoError(t, p.CallInto(ctx, &sgio.Ping{}, &sgio.Pong{}))
	require.NoError(t, p.CallInto(ctx, &sgio.Stats{}, &sgio.StatsReply{}))
	_, err := p.AskTxn(ctx, [16]byte{1}, 1)
	require.NoError(t, err)
	require.NoError(t, p.ReportTxn(ctx, [16]byte{1}, 0))
}

// TestRolesOperatorBackupNotStarvedByClients (issue 22, defect 11): backups are an
// operator's: clients holding as many connections as the engine runs backups cannot start
// one, so they cannot refuse the operator's. Fails on b3f6c9d: the clients' four held
// backups made the operator's ErrBusy.
func TestRolesOperatorBackupNotStarvedByClients(t *testing.T) {
	env := startServer(t)
	ctx := srvCtx(t)
	for i := range 5 {
		c := env.dial(testOwner + uint64(i))
		var chunk sgio.BackupChunk
		require.ErrorIs(t, c.CallInto(ctx, &sgio.Backup{}, &chunk), sgio.ErrForbidden, "client %d", i)
	}
	op := env.dial(0, asOperator)
	pullAll(t, op, 0)
}

// TestRolesSecretsDistinct: two roles with one secret are refused at New, also when the
// same key is written in two encodings; an empty role secret is no duplicate.
func TestRolesSecretsDistinct(t *testing.T) {
	dir := storenode.Options{Dir: t.TempDir()}
	b64 := []byte(base64.StdEncoding.EncodeToString(srvKey(t)))
	for _, cfg := range []Config{
		{Secret: srvSecret, PeerSecret: srvSecret},
		{Secret: srvSecret, OperatorSecret: srvSecret},
		{Secret: srvSecret, PeerSecret: srvPeerSecret, OperatorSecret: srvPeerSecret},
		{Secret: srvSecret, OperatorSecret: b64},
	} {
		cfg.Listen, cfg.Options = "127.0.0.1:0", dir
		_, err := New(cfg)
		require.ErrorIs(t, err, ErrRoleSecrets)
	}
	_, err := New(Config{Listen: "127.0.0.1:0", Secret: srvSecret, PeerSecret: []byte(" \n"), Options: dir})
	require.NoError(t, err)
	_, err = New(Config{Listen: "127.0.0.1:0", Secret: srvSecret, PeerSecret: []byte("weak"), Options: dir})
	require.ErrorIs(t, err, sgio.ErrWeakSecret)
}

// TestRolesUnconfiguredRoleRefused: a server configured with the clients' secret only (a
// deployment from before roles) accepts clients and no peer or operator: their secrets fail
// the handshake. Each role's session gets the server's proof made with its own key (Dial
// checks it).
func TestRolesUnconfiguredRoleRefused(t *testing.T) {
	env := startServer(t, func(cfg *Config) { cfg.PeerSecret, cfg.OperatorSecret = nil, nil })
	_, err := env.tryDial(0, asPeer)
	require.ErrorIs(t, err, sgio.ErrAuthFailed)
	_, err = env.tryDial(0, asOperator)
	require.ErrorIs(t, err, sgio.ErrAuthFailed)
	c := env.dial(testOwner)
	require.ErrorIs(t, c.CallInto(srvCtx(t), &sgio.Backup{}, &sgio.BackupChunk{}), sgio.ErrForbidden)
}

// TestRolesNoSecretIsEveryRole: without any secret (a loopback development node, as before
// roles) every session has every role: a backup, a resolver's Ask and a move step are served.
func TestRolesNoSecretIsEveryRole(t *testing.T) {
	env := startServer(t, func(cfg *Config) { cfg.Secret, cfg.PeerSecret, cfg.OperatorSecret = nil, nil, nil })
	noSecret := func(cfg *sgio.ClientConfig) { cfg.Secret = nil }
	ctx := srvCtx(t)
	c := env.dial(testOwner, noSecret)
	ti, _ := srvTable(t, c, "t", testOwner)
	_, err := c.AskTxn(ctx, [16]byte{1}, 1)
	require.NoError(t, err)
	require.NoError(t, c.ReportTxn(ctx, [16]byte{1}, 0))
	_, err = c.MoveStep(ctx, &sgio.Move{Op: sgio.MoveOpChanges, Table: ti.Table})
	require.NotErrorIs(t, err, sgio.ErrForbidden)
	pullAll(t, c, 0)
	require.Zero(t, env.srv.Stats().ForbiddenRequests)
}

// TestRolesClientCannotDropReleasedTableByClaimingItsOwnerID: a game server (owner
// testOwner) writes rows to its table and releases it (a graceful stop). Another client (a
// player's machine holding its own owner's secret) claims owner id testOwner in its Hello,
// with an incarnation of its own: with every game server holding the one clients' secret, a
// released id was anyone's to claim (Engine.Connect), mayDrop then found the table's last
// holder was the session's owner, and the drop of another owner's table with acknowledged
// rows succeeded.
//
// What should happen: owner ids are bound to the credential that proves them (an owner's
// derived secret, sgio.DeriveOwnerSecret, proves that owner id only): the claim is refused
// at authentication, the drop under the client's own id is refused with ErrForbidden, and
// the rows stay. Fails on b3f6c9d: no derived secret is accepted (and with the shared
// clients' secret the claim and the drop succeed).
func TestRolesClientCannotDropReleasedTableByClaimingItsOwnerID(t *testing.T) {
	env := startServer(t)
	ctx := srvCtx(t)
	a := env.dial(testOwner, asOwner(testOwner), func(cfg *sgio.ClientConfig) { cfg.Incarnation = [16]byte{0xa} })
	srvTableWithRow(t, ctx, a, "a", 5)
	require.NoError(t, a.CallInto(ctx, &sgio.Release{Owner: testOwner}, &sgio.OK{}))
	require.NoError(t, a.Close())

	const thiefOwner = testOwner + 100
	_, err := env.tryDial(testOwner, asOwner(thiefOwner), func(cfg *sgio.ClientConfig) { cfg.Incarnation = [16]byte{0xb, 0xad} })
	require.ErrorIs(t, err, sgio.ErrAuthFailed, "a client claimed a released owner id with another owner's secret")
	thief := env.dial(thiefOwner, asOwner(thiefOwner))
	err = thief.CallInto(ctx, &sgio.DropTable{Name: "a"}, &sgio.OK{})
	require.ErrorIs(t, err, sgio.ErrForbidden, "a client dropped another game server's released table")
	_, err = env.srv.Engine().OpenTable("a")
	require.NoError(t, err, "the table and its rows are still there")
}

// TestOwnerIDNotTakenOverByPublishedIncarnation: a live game server's identity (owner id
// and incarnation) was taken over by any client that sent the same pair in its Hello: a
// claim of the same incarnation replaces the live connection (Engine.Connect: that is how a
// transaction node's reconnect replaces its stale connection). The incarnation is no secret
// in a cluster: etcd's owner values carry it (cluster.Holder, encodeOwner) for every game
// server holding a partition, and cluster's ownership errors hand the holder to whoever
// asks. So a client read it, claimed the victim's id with it, evicted the victim's
// connection and wrote the victim's table as the victim.
//
// What should happen: a live identity is not replaced on the strength of an owner id and an
// incarnation other game servers can read: each game server holds its own owner's derived
// secret (sgio.DeriveOwnerSecret), which proves no other owner id, so the attacker's claim
// is refused at authentication (ErrAuthFailed) and the victim's session lives on. Fails on
// b3f6c9d: no derived secret is accepted (and with the shared clients' secret the victim's
// connection is closed and the attacker's commit is acknowledged as the victim's).
func TestOwnerIDNotTakenOverByPublishedIncarnation(t *testing.T) {
	env := startServer(t)
	ctx := srvCtx(t)
	inc := [16]byte{0x1c, 0xa7}
	victim := env.dial(testOwner, asOwner(testOwner), func(cfg *sgio.ClientConfig) { cfg.Incarnation = inc })
	ti, g := srvTableWithRow(t, ctx, victim, "bank", 100)

	const thiefOwner = testOwner + 100
	thief, err := env.tryDial(testOwner, asOwner(thiefOwner), func(cfg *sgio.ClientConfig) { cfg.Incarnation = inc })
	if err == nil {
		defer thief.Close()
		var g2 sgio.Grant
		if thief.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Owner: testOwner}, &g2) == nil {
			_ = thief.CallInto(ctx, srvCommit(ti.Table, testOwner, g2.Epoch, g2.LastSeq+1, []uint64{1}, 666), &sgio.CommitAck{})
		}
	}
	require.ErrorIs(t, err, sgio.ErrAuthFailed, "a client took a live game server's identity with its published incarnation")
	require.NoError(t, victim.CallInto(ctx, &sgio.Ping{}, &sgio.Pong{}), "the victim's session lives on")
	require.NoError(t, victim.CallInto(ctx, srvCommit(ti.Table, testOwner, g.Epoch, g.LastSeq+2, []uint64{1}, 101), &sgio.CommitAck{}),
		"the victim's grant is still its own")
	// The thief's secret is good for its own owner id.
	env.dial(thiefOwner, asOwner(thiefOwner))
}

// TestRolesClientCannotDropReleasedTableByAcquiringIt: the same drop without claiming any
// owner id: a client of its own owner id Acquires the released table (a released lease is
// anyone's: that is how ownership moves between game servers), which makes it the table's
// last holder, then drops it: mayDrop finds the holder is the session's owner. A game
// server's secret drops any table whose holder released it (or whose lease ran out).
//
// What should happen: a client drops only a table no other owner ever held (never granted,
// or it holds its first grant), so the drop is refused with ErrForbidden and the rows stay.
// Fails on b3f6c9d: the drop succeeds.
func TestRolesClientCannotDropReleasedTableByAcquiringIt(t *testing.T) {
	env := startServer(t)
	ctx := srvCtx(t)
	a := env.dial(testOwner)
	ti, _ := srvTableWithRow(t, ctx, a, "a", 5)
	require.NoError(t, a.CallInto(ctx, &sgio.Release{Owner: testOwner}, &sgio.OK{}))

	const thief = testOwner + 100
	b := env.dial(thief)
	require.NoError(t, b.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Owner: thief}, &sgio.Grant{}))
	require.ErrorIs(t, b.CallInto(ctx, &sgio.DropTable{Name: "a"}, &sgio.OK{}), sgio.ErrForbidden,
		"a client dropped another game server's released table by acquiring it first")
	_, err := env.srv.Engine().OpenTable("a")
	require.NoError(t, err, "the table and its rows are still there")
}
