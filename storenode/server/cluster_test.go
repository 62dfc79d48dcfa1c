package server

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// gateVerifier is an in-memory storenode.GrantVerifier whose verifications wait for a gate:
// an etcd that answers late. Package cluster's tests run the real one.
type gateVerifier struct {
	mu      sync.Mutex
	owners  map[uint32]uint64 // partition -> owner
	epochs  map[uint32]uint64 // partition -> revision
	gate    chan struct{}
	entered chan struct{}
}

func (v *gateVerifier) VerifyGrant(ctx context.Context, table string, p uint32, owner, epoch uint64) error {
	v.entered <- struct{}{}
	select {
	case <-v.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if table != "acct" || v.owners[p] != owner || v.epochs[p] != epoch {
		return fmt.Errorf("not the owner key: %w", storenode.ErrFenced)
	}
	return nil
}

func (v *gateVerifier) Revision(context.Context) (uint64, error) { return 1000, nil }

// An etcd grant's registration waits for etcd on a goroutine, never on the event loop: while
// the verification waits, the same connection's pings and another table's commits are
// answered; then the grant is answered, a forged one refused (ErrFenced across the wire), a
// local-counter Acquire of the cluster table refused (ErrMalformed: the wrong kind of grant),
// and the table's description carries its layout.
func TestServerEtcdGrantOffLoop(t *testing.T) {
	v := &gateVerifier{owners: map[uint32]uint64{1: 5}, epochs: map[uint32]uint64{1: 777},
		gate: make(chan struct{}), entered: make(chan struct{}, 4)}
	env := startServer(t, func(cfg *Config) { cfg.Options.GrantVerifier = v })
	c := env.dial(5)
	ctx := srvCtx(t)
	var ti sgio.TableInfo
	layout := base.ClusterLayout{Partitions: 2, StripePages: 1, Partition: 1}
	require.NoError(t, c.CallInto(ctx, &sgio.CreateClusterTable{RowBytes: 64, Layout: layout, Name: base.PartitionTableName("acct", 1)}, &ti))
	require.Equal(t, layout, ti.Cluster)
	var listed sgio.TableList
	require.NoError(t, c.CallInto(ctx, &sgio.ListTables{}, &listed))
	require.Len(t, listed.Tables, 1)
	require.Equal(t, layout, listed.Tables[0].Cluster)
	local, g := srvTable(t, c, "local", 5)

	err := c.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Owner: 5}, &sgio.Grant{})
	require.ErrorIs(t, err, sgio.ErrMalformed)
	require.Contains(t, err.Error(), "cluster-managed")

	done := make(chan error, 1)
	var got sgio.Grant
	go func() {
		done <- c.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Flags: sgio.AcquireEtcdGrant, Owner: 5, Epoch: 777}, &got)
	}()
	<-v.entered
	require.NoError(t, c.CallInto(ctx, &sgio.Ping{}, &sgio.Pong{}), "a ping while the verification waits")
	require.NoError(t, c.CallInto(ctx, srvCommit(local.Table, 5, g.Epoch, 1, []uint64{1}, 11), &sgio.CommitAck{}))
	require.Empty(t, done)
	close(v.gate)
	require.NoError(t, <-done)
	require.EqualValues(t, 777, got.Epoch)
	require.Zero(t, got.LeaseMillis, "etcd decides when the grant ends")

	// A forged grant (another revision) is refused; the current one renews.
	err = c.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Flags: sgio.AcquireEtcdGrant, Owner: 5, Epoch: 778}, &sgio.Grant{})
	<-v.entered
	require.ErrorIs(t, err, sgio.ErrFenced)
	require.NoError(t, c.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Flags: sgio.AcquireEtcdGrant, Owner: 5, Epoch: 777}, &sgio.Grant{}))
	// An etcd grant of the local table: the wrong kind.
	err = c.CallInto(ctx, &sgio.Acquire{Table: local.Table, Flags: sgio.AcquireEtcdGrant, Owner: 5, Epoch: 777}, &sgio.Grant{})
	require.ErrorIs(t, err, sgio.ErrMalformed)
}
