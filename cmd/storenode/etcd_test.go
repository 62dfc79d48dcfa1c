package main

import (
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/etcdtest"
	"github.com/weftdb/weft/sgio"
)

// With -etcd and -etcd-prefix the storage node verifies etcd grants in that etcd, under that
// prefix: a grant etcd holds is registered, a forged one refused; without -etcd it refuses
// every etcd grant (ErrUnsupported: no etcd configured).
func TestRunEtcdVerifiesGrants(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	srv := etcdtest.Start(t)
	const prefix = "/run-etcd/"
	c, err := cluster.Connect(ctx, cluster.Config{Endpoints: srv.Endpoints(), Prefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.CreateTable(ctx, "acct", cluster.Layout{Partitions: 1, StripePages: 1}, []string{"n:1"})
	require.NoError(t, err)
	s, err := c.NewSession(ctx, cluster.SessionConfig{Owner: 1})
	require.NoError(t, err)
	defer s.Close(ctx)
	o, err := s.Acquire(ctx, "acct", 0)
	require.NoError(t, err)

	for _, withEtcd := range []bool{true, false} {
		args := []string{"--dir", t.TempDir(), "--listen", "127.0.0.1:0", "--sync", "none"}
		if withEtcd {
			args = append(args, "--etcd", srv.Endpoints()[0], "--etcd-prefix", prefix)
		}
		r := startRun(t, args, nil)
		cl := dial(t, r.server.String(), nil, nil)
		var ti sgio.TableInfo
		require.NoError(t, cl.CallInto(ctx, &sgio.CreateClusterTable{RowBytes: 64, Name: base.PartitionTableName("acct", 0),
			Layout: base.ClusterLayout{Partitions: 1, StripePages: 1}}, &ti))
		err := cl.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Flags: sgio.AcquireEtcdGrant, Owner: 1, Epoch: o.Epoch() + 1}, &sgio.Grant{})
		if !withEtcd {
			require.ErrorIs(t, err, sgio.ErrUnsupported)
			require.Equal(t, exitOK, r.stop(t))
			continue
		}
		require.ErrorIs(t, err, sgio.ErrFenced, "a revision etcd did not grant")
		var g sgio.Grant
		require.NoError(t, cl.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Flags: sgio.AcquireEtcdGrant, Owner: 1, Epoch: o.Epoch()}, &g))
		require.Equal(t, o.Epoch(), g.Epoch)
		require.Equal(t, exitOK, r.stop(t))
	}
}
