package server

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// TestPeerDialsOnlyStorageNodes: a Peer dials only PeerConfig.Peers and its Directory's
// nodes, nobody with neither (review defect 1: a client's listener named as a primary got
// the resolver's handshake under the peers' secret). Fails on b3f6c9d: every address was
// dialed.
func TestPeerDialsOnlyStorageNodes(t *testing.T) {
	primary := startServer(t, func(cfg *Config) { cfg.Options.LeaseChecker = &txnLeases{} })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		if c, err := ln.Accept(); err == nil {
			c.Close()
			accepted <- struct{}{}
		}
	}()
	ctx := srvCtx(t)
	id := base.TxnID{1}

	none := NewTxnPeer(PeerConfig{Secret: srvPeerSecret, DialTimeout: srvTestTimeout})
	defer none.Close()
	_, err = none.AskTxn(ctx, primary.addr, id, 7)
	require.ErrorIs(t, err, ErrUnknownPrimary, "no storage node configured: no dial at all")
	require.NoError(t, none.CheckPrimary(ctx, ln.Addr().String()), "a prepare is accepted: its coordinator finishes it")

	static := NewTxnPeer(PeerConfig{Secret: srvPeerSecret, DialTimeout: srvTestTimeout, Peers: []string{primary.addr}})
	defer static.Close()
	d, err := static.AskTxn(ctx, primary.addr, id, 7)
	require.NoError(t, err)
	require.Equal(t, base.DecisionNone, d)
	_, err = static.AskTxn(ctx, ln.Addr().String(), id, 7)
	require.ErrorIs(t, err, ErrUnknownPrimary)
	require.ErrorIs(t, static.ReportTxn(ctx, ln.Addr().String(), id, 1), ErrUnknownPrimary)
	require.ErrorIs(t, static.CheckPrimary(ctx, ln.Addr().String()), ErrUnknownPrimary)

	dir := &txnLeases{nodes: []string{primary.addr}}
	mapped := NewTxnPeer(PeerConfig{Secret: srvPeerSecret, DialTimeout: srvTestTimeout, Directory: dir})
	defer mapped.Close()
	_, err = mapped.AskTxn(ctx, primary.addr, id, 7)
	require.NoError(t, err)
	_, err = mapped.AskTxn(ctx, ln.Addr().String(), id, 7)
	require.ErrorIs(t, err, ErrUnknownPrimary)

	require.NoError(t, ln.Close())
	_, dialed := <-accepted
	require.False(t, dialed, "the client's listener was dialed")
}

// countingDirectory is a PeerDirectory that counts its reads and fails while fail is set.
type countingDirectory struct {
	mu    sync.Mutex
	nodes []string
	reads int
	fail  bool
}

func (d *countingDirectory) StorageNodes(ctx context.Context) ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reads++
	if d.fail {
		return nil, errors.New("etcd away")
	}
	return d.nodes, nil
}

func (d *countingDirectory) set(fail bool, nodes ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.fail, d.nodes = fail, nodes
}

// TestPeerDirectoryReadsBounded: the Directory (etcd) is read again only when its list is
// older than peerDirectoryTTL or lacks the address, at most once per peerDirectoryMissEvery
// (a client naming made-up primaries cannot load etcd); a failed read keeps the last list.
func TestPeerDirectoryReadsBounded(t *testing.T) {
	clock := &fakeClock{}
	dir := &countingDirectory{nodes: []string{"a:1"}}
	d := newPeerDirectory(&PeerConfig{Directory: dir, Now: clock.Now, After: clock.After})
	ctx := srvCtx(t)

	require.NoError(t, d.check(ctx, "a:1"))
	require.Equal(t, 1, dir.reads)
	begin := clock.Now()
	for range 100 {
		require.NoError(t, d.check(ctx, "a:1"))
		require.ErrorIs(t, d.check(ctx, "made-up:1"), ErrUnknownPrimary)
	}
	// Each made-up address waited for the next read allowed (the fake timer moves the clock).
	elapsed := clock.Now().Sub(begin)
	require.Equal(t, 100*peerDirectoryMissEvery, elapsed, "each miss waited out the window once")
	require.Equal(t, 1+int(elapsed/peerDirectoryMissEvery), dir.reads, "one read per peerDirectoryMissEvery at most")
	reads := dir.reads

	dir.set(false, "a:1", "b:1") // a node joins
	clock.Advance(peerDirectoryMissEvery)
	require.NoError(t, d.check(ctx, "b:1"))
	require.Equal(t, reads+1, dir.reads)

	dir.set(true) // etcd away: the last list stays
	clock.Advance(peerDirectoryTTL)
	require.NoError(t, d.check(ctx, "a:1"))
	require.Equal(t, reads+2, dir.reads)
	require.NoError(t, d.check(ctx, "b:1"))
	require.Equal(t, reads+2, dir.reads, "the failed read is retried at most every peerDirectoryMissEvery")

	dir.set(false, "b:1") // a left the map
	clock.Advance(peerDirectoryTTL)
	require.ErrorIs(t, d.check(ctx, "a:1"), ErrUnknownPrimary)
	require.Equal(t, reads+3, dir.reads)

	never := newPeerDirectory(&PeerConfig{Directory: &countingDirectory{fail: true}, Now: clock.Now, After: clock.After})
	err := never.check(ctx, "a:1")
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrUnknownPrimary, "etcd's failure, told as such")
}

// A storage node that joins the map just after the list was read (a partition moved to a
// node that held none) is known to the next check that names it: the check waits for the
// next read allowed instead of refusing until the list is read again for another reason
// (before, every prepare naming it as primary was refused for up to peerDirectoryMissEvery).
func TestPeerDirectoryMissWaitsForNextRead(t *testing.T) {
	clock := &fakeClock{}
	dir := &countingDirectory{nodes: []string{"a:1"}}
	d := newPeerDirectory(&PeerConfig{Directory: dir, Now: clock.Now, After: clock.After})
	ctx := srvCtx(t)

	require.NoError(t, d.check(ctx, "a:1"))
	dir.set(false, "a:1", "b:1") // b joins the map right after the read
	begin := clock.Now()
	require.NoError(t, d.check(ctx, "b:1"), "found by the next read")
	require.Equal(t, 2, dir.reads)
	require.Equal(t, peerDirectoryMissEvery, clock.Now().Sub(begin), "waited for the window, no longer")

	ended, cancel := context.WithCancel(ctx)
	cancel()
	at := clock.Now()
	require.ErrorIs(t, d.check(ended, "c:1"), ErrUnknownPrimary)
	require.Equal(t, at, clock.Now(), "a context ended does not wait")
	require.Equal(t, 2, dir.reads)
}
