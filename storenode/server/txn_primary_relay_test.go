package server

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
)

// relayFrame copies the next whole frame from r to w, as read, and returns its type.
func relayFrame(r *bufio.Reader, w net.Conn) (sgio.Type, error) {
	f, n, err := sgio.ReadFrame(r, sgio.MaxBodyLimit)
	if err != nil {
		return 0, err
	}
	raw, err := r.Peek(n)
	if err != nil {
		return 0, err
	}
	if _, err := w.Write(raw); err != nil {
		return 0, err
	}
	_, err = r.Discard(n)
	return f.Type, err
}

// TestTxnPrimaryResolverHandshakeNotRelayable: a client (a game server's secret only)
// prepares a part of its own naming as its primary an address it listens on. The node's
// resolver dialed that "primary" with the peers' secret; the attacker relayed the resolver's
// handshake (Hello, HelloReply, Auth, AuthOK, verbatim) to the node itself, then kept the
// node's side of the connection: a session the node authenticated as a peer (the handshake
// authenticates the ends, not what follows it, and nothing binds the proof to the server the
// resolver meant to reach). With it, the attacker sent TxnApply{abort} of another owner's
// prepared part: it was applied.
//
// What should happen: the prepare is refused (its primary is not a storage node of the
// cluster: the PeerDirectory), and a part naming such a primary anyway (prepared before the
// check, or by a coordinator of the engine itself) is never dialed by the resolver; a peer's
// TxnApply would be Forbidden anyway (TestRolesOperatorApplyNotPeers). The other owner's part
// stays prepared. Fails on b3f6c9d: the prepare is accepted, the hijacked session's TxnApply
// is answered OK and the victim's part is aborted.
func TestTxnPrimaryResolverHandshakeNotRelayable(t *testing.T) {
	a, _, clock, ctx := startTxnNodeWithRow(t)
	victim := [16]byte{0x71, 1}
	_, err := a.coord.PrepareTxn(ctx, &sgio.TxnPrepare{Txn: victim, Lease: 41, Index: 0, Commit: *a.commit(1, 990)})
	require.NoError(t, err)

	// The attacker: a client of its own owner id, its own table, and a fake primary.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	hijacked := make(chan net.Conn, 1)
	go func() {
		defer close(hijacked)
		r, err := ln.Accept()
		if err != nil {
			return
		}
		defer r.Close()
		s, err := net.Dial("tcp", a.env.addr)
		if err != nil {
			return
		}
		rr, sr := bufio.NewReaderSize(r, sgio.HeaderSize+4096), bufio.NewReaderSize(s, sgio.HeaderSize+4096)
		for range 2 { // Hello -> HelloReply, Auth -> AuthOK
			if _, err := relayFrame(rr, s); err != nil {
				s.Close()
				return
			}
			if ty, err := relayFrame(sr, r); err != nil || ty == sgio.TypeError {
				s.Close()
				return
			}
		}
		hijacked <- s // the resolver's side is closed: its call fails
	}()

	const attacker = testOwner + 100
	c := a.env.dial(attacker)
	ti, g := srvTable(t, c, "mine", attacker)
	m := srvCommit(ti.Table, attacker, g.Epoch, g.LastSeq+1, []uint64{1}, 1)
	_, err = c.PrepareTxn(ctx, &sgio.TxnPrepare{Txn: [16]byte{0x72}, Lease: 99, Index: 1, Primary: ln.Addr().String(), Commit: *m})
	require.ErrorIs(t, err, sgio.ErrMalformed, "a primary that is no storage node of the cluster")
	require.ErrorContains(t, err, "not a storage node of the cluster")

	// The same part in the engine anyway: the resolver must not dial its primary.
	b := &base.Batch{Owner: attacker, Seq: m.Seq}
	for _, f := range m.Fences {
		b.Fences = append(b.Fences, f)
	}
	for _, sg := range m.Segments {
		b.Segments = append(b.Segments, sg)
	}
	_, err = a.eng().PrepareTxn(&base.TxnPrepare{Txn: [16]byte{0x72}, Lease: 99, Index: 1, Primary: ln.Addr().String(), Batch: b})
	require.NoError(t, err)

	clock.Advance(time.Second)
	err = a.eng().ResolveTxns(ctx) // would dial the attacker's "primary"
	require.ErrorIs(t, err, ErrUnknownPrimary)
	require.True(t, a.eng().TxnStatus([16]byte{0x72}).Prepared, "the attacker's part stays in doubt")
	require.NoError(t, ln.Close()) // the attacker's Accept returns: nothing was dialed
	s, ok := <-hijacked
	if ok {
		defer s.Close()
		require.NoError(t, s.SetDeadline(time.Now().Add(srvTestTimeout)))
		_, err = s.Write(sgio.AppendFrame(nil, 1, &sgio.TxnApply{Txn: victim, Decision: sgio.TxnAbort}))
		require.NoError(t, err)
		f, _, err := sgio.ReadFrame(sgio.NewFrameReader(s, 1<<16), 1<<16)
		require.NoError(t, err)
		require.NotEqual(t, sgio.TypeOK, f.Type, "a client's relay of the resolver's handshake is a peer session")
	}
	require.False(t, ok, "the resolver dialed a client's listener with the peers' secret")
	require.True(t, a.eng().TxnStatus(victim).Prepared, "another owner's part stays prepared")
	d, err := a.coord.DecideTxn(ctx, victim, 41, sgio.TxnCommit, 1)
	require.NoError(t, err)
	require.Equal(t, sgio.TxnCommit, d)
	require.Equal(t, base.DecisionNone, a.eng().TxnStatus(victim).Applied)
}
