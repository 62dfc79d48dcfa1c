package server

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// askWatch is a TxnPeer that counts the calls begun to other primaries than the victim's
// transaction's, and tells when the resolver first asks about the victim (with that count)
// and when its report to the primary returned.
type askWatch struct {
	*Peer
	victim   base.TxnID
	mu       sync.Mutex
	others   int           // AskTxn calls begun about other transactions
	inflight int           // of them, in flight
	slots    int           // full is closed once that many are in flight
	full     chan struct{} // closed once slots calls about others are in flight at once
	asked    chan int      // the count of others when the victim was first asked
	reported chan struct{} // the victim's report to its primary returned OK
}

func (w *askWatch) AskTxn(ctx context.Context, addr string, id base.TxnID, lease int64) (base.Decision, error) {
	w.mu.Lock()
	if id == w.victim {
		select {
		case w.asked <- w.others:
		default:
		}
	} else {
		w.others++
		if w.inflight++; w.inflight == w.slots {
			close(w.full)
		}
	}
	w.mu.Unlock()
	d, err := w.Peer.AskTxn(ctx, addr, id, lease)
	if id != w.victim {
		w.mu.Lock()
		w.inflight--
		w.mu.Unlock()
	}
	return d, err
}

func (w *askWatch) ReportTxn(ctx context.Context, addr string, id base.TxnID, index uint16) error {
	err := w.Peer.ReportTxn(ctx, addr, id, index)
	if id == w.victim && err == nil {
		select {
		case w.reported <- struct{}{}:
		default:
		}
	}
	return err
}

// TestTxnResolverNotDelayedByOthersUnreachablePrimaries: a resolver pass calls the
// primaries of its parts TxnResolvePrimariesMax (16) at a time, each call up to
// TxnCallTimeout (5 s by default). A client prepares, within its own per-owner bound (256),
// parts of its own table naming as many distinct primaries that accept and never answer
// (storage nodes of the map that hang: since review defect 1 a client can name no other). A real transaction's part at this node, whose coordinator decided commit at
// its primary and died before applying here, must not wait behind them: on d707e6a the runs
// started in the order of the primaries' addresses (the real primary's, "localhost:...",
// after the client's), so its rows stayed locked for len(parts)/16 x TxnCallTimeout per pass
// (80 s with the defaults and 256 parts).
//
// What should happen: the pass takes the owners' parts in turn, so the real part's primary is
// among the first runs started, before the client's hanging primaries fill the 16 slots (the
// real part's run holds one until it is done). With TxnCallTimeout an hour, the count of
// calls begun is deterministic: fewer than 16 to the hanging primaries before the real
// primary is asked. Fails on b3f6c9d: 16 hanging calls in flight, the real primary not asked.
func TestTxnResolverNotDelayedByOthersUnreachablePrimaries(t *testing.T) {
	const hangs, callTimeout, slots = 128, time.Hour, storenode.DefaultTxnResolvePrimariesMax
	leases, clock := &txnLeases{}, &fakeClock{}
	primary := startTxnNode(t, leases, clock)
	victim := base.TxnID{0x7a}
	watch := &askWatch{Peer: NewTxnPeer(PeerConfig{Secret: srvPeerSecret, Name: "resolver", DialTimeout: callTimeout, Directory: leases, Now: clock.Now}),
		victim: victim, slots: slots, full: make(chan struct{}), asked: make(chan int, 1), reported: make(chan struct{}, 1)}
	env := startServer(t, func(cfg *Config) {
		cfg.Options.LeaseChecker = leases
		cfg.Options.TxnPeer = watch
		cfg.Options.TxnResolveInterval = -1
		cfg.Options.TxnResolveAfter = time.Second
		cfg.Options.TxnCallTimeout = callTimeout
		cfg.Options.Now = clock.Now
	})
	t.Cleanup(func() { watch.Peer.Close() }) // before the server's leak check
	ctx := srvCtx(t)

	// The hanging primaries: storage nodes of the map (a client can name no other primary:
	// TestTxnPrimaryResolverHandshakeNotRelayable) that accept and never answer.
	var held sync.WaitGroup
	t.Cleanup(held.Wait)
	hanging := make([]string, hangs)
	for i := range hangs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { ln.Close() })
		held.Add(1)
		go func() { // holds what it accepts, says nothing, until the listener closes
			defer held.Done()
			var conns []net.Conn
			defer func() {
				for _, c := range conns {
					c.Close()
				}
			}()
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				conns = append(conns, conn)
			}
		}()
		hanging[i] = ln.Addr().String()
		leases.addNode(hanging[i])
	}
	_, port, _ := strings.Cut(primary.env.addr, ":")
	leases.addNode("localhost:" + port)

	// The transfer: prepared at both, decided commit at its primary, applied there only.
	require.NoError(t, primary.coord.CallInto(ctx, primary.commit(1, 1000), &sgio.CommitAck{}))
	_, err := primary.coord.PrepareTxn(ctx, &sgio.TxnPrepare{Txn: victim, Lease: 41, Index: 0, Commit: *primary.commit(1, 990)})
	require.NoError(t, err)
	v := env.dial(testOwner)
	vt, vg := srvTable(t, v, "bank", testOwner)
	_, err = v.PrepareTxn(ctx, &sgio.TxnPrepare{Txn: victim, Lease: 41, Index: 1, Primary: "localhost:" + port,
		Commit: *srvCommit(vt.Table, testOwner, vg.Epoch, vg.LastSeq+1, []uint64{1}, 1010)})
	require.NoError(t, err)
	d, err := primary.coord.DecideTxn(ctx, victim, 41, sgio.TxnCommit, 2)
	require.NoError(t, err)
	require.Equal(t, sgio.TxnCommit, d)
	require.NoError(t, primary.coord.ApplyTxn(ctx, victim, sgio.TxnCommit))

	// The client: parts naming primaries that accept and never answer.
	const attacker = testOwner + 100
	c := env.dial(attacker)
	ti, g := srvTable(t, c, "mine", attacker)
	for i := range hangs {
		m := srvCommit(ti.Table, attacker, g.Epoch, g.LastSeq+1+uint64(i), []uint64{uint64(i)}, 1)
		_, err = c.PrepareTxn(ctx, &sgio.TxnPrepare{Txn: [16]byte{0xa7, byte(i)}, Lease: 99, Index: 1, Primary: hanging[i], Commit: *m})
		require.NoError(t, err)
	}

	clock.Advance(time.Second)
	pass, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- env.srv.Engine().ResolveTxns(pass) }()
	var others int
	select {
	case others = <-watch.asked:
	case <-watch.full:
		select { // asked, then its run done, then the slots filled: both ready
		case others = <-watch.asked:
		default:
			t.Fatalf("%d calls to the client's hanging primaries in flight, the victim's primary not asked", slots)
		}
	case <-ctx.Done():
		t.Fatal("the victim's primary was never asked")
	}
	require.Less(t, others, slots, "calls to the client's hanging primaries begun before the victim's primary is asked")
	select {
	case <-watch.reported:
	case <-ctx.Done():
		t.Fatal("the victim's part was never reported")
	}
	require.False(t, env.srv.Engine().TxnStatus(victim).Prepared, "the victim's part is resolved (commit)")
	cancel() // the hanging calls end with the pass
	require.ErrorIs(t, <-done, context.Canceled)
}
