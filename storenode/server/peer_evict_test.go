package server

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// gateLease is a LeaseChecker whose checks wait for gate (a primary's etcd answering late);
// entered hears each check begin.
type gateLease struct {
	gate    chan struct{}
	entered chan struct{}
}

func (l *gateLease) LeaseAlive(ctx context.Context, _ int64) (bool, error) {
	l.entered <- struct{}{}
	select {
	case <-l.gate:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// The resolver calls distinct primaries concurrently (Options.TxnResolvePrimariesMax), so a
// Peer at its connection bound (PeersMax) must not close a connection a call is using to make
// room for another primary's: the call in flight failed with a closed connection (and its
// primary was skipped for the pass). Fails on bc2d8a2 (with probability 1-2^-12: the evicted
// connection was any one, here A's in use or the idle one): A's call failed.
func TestPeerKeepsConnectionsInUse(t *testing.T) {
	slow := &gateLease{gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	a := startServer(t, func(cfg *Config) { cfg.Options.LeaseChecker = slow })
	var others [2]*srvEnv
	for i := range others {
		others[i] = startServer(t, func(cfg *Config) { cfg.Options.LeaseChecker = &txnLeases{} })
	}
	peer := NewTxnPeer(PeerConfig{Secret: srvPeerSecret, Name: "resolver", DialTimeout: srvTestTimeout, PeersMax: 2,
		Peers: []string{a.addr, others[0].addr, others[1].addr}})
	defer peer.Close()
	id := base.TxnID{1}

	type answer struct {
		d   base.Decision
		err error
	}
	got := make(chan answer, 1)
	go func() {
		d, err := peer.AskTxn(srvCtx(t), a.addr, id, 7)
		got <- answer{d, err}
	}()
	<-slow.entered // A's call is in flight on its connection
	for i := range 12 {
		d, err := peer.AskTxn(srvCtx(t), others[i%2].addr, id, 7)
		require.NoError(t, err)
		require.Equal(t, base.DecisionNone, d, "the lease is alive")
	}
	close(slow.gate)
	r := <-got
	require.NoError(t, r.err, "A's call in flight lost its connection to another primary's dial")
	require.Equal(t, base.DecisionNone, r.d)
	peer.mu.Lock()
	require.LessOrEqual(t, len(peer.clients), 2, "PeersMax")
	peer.mu.Unlock()
}
