package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// stallVerifier is a GrantVerifier that answers the rightful owner's grant at once and makes
// every other registration wait until release is closed (an etcd slow on reads of made-up
// keys), then refuses it. entered is told of each verification that waits.
type stallVerifier struct {
	owner, epoch uint64
	entered      chan struct{}
	release      chan struct{}
}

func (v *stallVerifier) VerifyGrant(ctx context.Context, table string, p uint32, owner, epoch uint64) error {
	if owner == v.owner && epoch == v.epoch {
		return nil
	}
	v.entered <- struct{}{}
	select {
	case <-v.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return fmt.Errorf("not the owner key: %w", storenode.ErrFenced)
}

func (v *stallVerifier) Revision(context.Context) (uint64, error) { return 1000, nil }

// Issue 22, defect 10: made-up AcquireEtcdGrant registrations from 8 connections held the 16
// verification slots, and the rightful owner's registration waited ~5 s or was refused. A
// connection holds at most 2 slots (its second only while half are free), one that may take
// none is refused at once with a busy code, and the rightful registration from a 9th
// connection is answered while the 8 still hold theirs. Fails on b3f6c9d: the 8 took all 16
// slots and the rest queued, and the rightful registration ran out of GrantVerifyTimeout.
func TestGrantVerificationPerConnectionCap(t *testing.T) {
	const hostile, each = 8, 3
	v := &stallVerifier{owner: 5, epoch: 777, entered: make(chan struct{}, hostile*each), release: make(chan struct{})}
	env := startServer(t, func(cfg *Config) {
		cfg.Options.GrantVerifier = v
		cfg.Options.GrantVerifyTimeout = 2 * time.Second // bounds the test on b3f6c9d
	})
	defer close(v.release) // before the server's cleanup: no verification left waiting
	ctx := srvCtx(t)
	c := env.dial(5)
	var ti sgio.TableInfo
	layout := base.ClusterLayout{Partitions: 2, StripePages: 1, Partition: 1}
	require.NoError(t, c.CallInto(ctx, &sgio.CreateClusterTable{RowBytes: 64, Layout: layout, Name: base.PartitionTableName("acct", 1)}, &ti))

	results := make(chan error, hostile*each)
	for h := range hostile {
		hc := env.dial(uint64(100 + h))
		for k := range each {
			go func() {
				results <- hc.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Flags: sgio.AcquireEtcdGrant, Owner: uint64(100 + h), Epoch: uint64(2000 + k)}, &sgio.Grant{})
			}()
		}
	}
	// Every made-up registration either holds a slot (waits in the verifier) or was refused.
	held, refused := 0, 0
	for held+refused < hostile*each {
		select {
		case <-v.entered:
			held++
		case err := <-results:
			require.ErrorIs(t, err, sgio.ErrBusy, "refused as busy: ask again")
			refused++
		case <-ctx.Done():
			t.Fatalf("%d held, %d refused", held, refused)
		}
	}
	require.Less(t, held, 16, "the engine's 16 slots: the hostile connections hold some slots, never all")
	require.LessOrEqual(t, held, hostile*2)

	// The rightful owner's registration, on a 9th connection, while the 8 hold theirs.
	var g sgio.Grant
	require.NoError(t, c.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Flags: sgio.AcquireEtcdGrant, Owner: 5, Epoch: 777}, &g))
	require.EqualValues(t, 777, g.Epoch)
}
