package cluster

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster/etcdtest"
	"github.com/weftdb/weft/internal/testseed"
)

// modelNode is one node of TestOwnershipModel: a session over its own cuttable network.
type modelNode struct {
	id    uint64
	p     *etcdtest.Proxy
	c     *Client
	s     *Session
	cut   bool
	owned map[uint32]*Ownership
}

// Random acquires, releases, network cuts and restores, closes and takeovers by nodes of
// short leases. The safety property checked at every grant: every other grant of the
// partition ever handed out has stopped vouching (Check fails), and the new epoch is above
// every earlier one. WEFT_SEED replays a run.
func TestOwnershipModel(t *testing.T) {
	ctx := testCtx(t)
	seed := testseed.Seed(t)
	t.Logf("seed %d (%s=%d replays it)", seed, testseed.Env, seed)
	rng := rand.New(rand.NewPCG(seed, seed>>1))
	srv := sharedEtcd(t)
	prefix := newPrefix(t)
	c := connect(t, prefix, srv.Endpoints()...)
	const nodes, parts = 3, 4
	steps, takeoversMax := 120, 4
	if testing.Short() {
		steps, takeoversMax = 50, 2
	}
	createTable(t, c, "t", parts)

	ns := make([]*modelNode, nodes)
	for i := range ns {
		n := &modelNode{id: uint64(i + 1), p: newProxy(t, srv.Addr()), owned: make(map[uint32]*Ownership)}
		n.c = connect(t, prefix, n.p.Endpoint())
		ns[i] = n
	}
	start := func(n *modelNode) {
		n.s = newSessionTTL(t, n.c, n.id, nil, testTTL)
		n.owned = make(map[uint32]*Ownership)
	}
	for _, n := range ns {
		start(n)
	}
	var grants [parts][]*Ownership
	var last [parts]uint64
	granted := func(o *Ownership) {
		t.Helper()
		p := o.Part()
		if n := len(grants[p]); n > 0 && o.Epoch() == last[p] {
			// A session adopting its own key, whose release failed (etcd unreachable): the
			// same grant, continuously held, under a new Ownership.
			require.Same(t, grants[p][n-1].Session(), o.Session(), "partition %d: epoch %d granted twice", p, o.Epoch())
		} else {
			require.Greater(t, o.Epoch(), last[p], "partition %d: epoch not above the last grant's", p)
		}
		last[p] = o.Epoch()
		for _, q := range grants[p] {
			if q != o {
				require.Error(t, q.Check(), "partition %d: grant of epoch %d still vouches beside epoch %d", p, q.Epoch(), o.Epoch())
			}
		}
		grants[p] = append(grants[p], o)
	}
	live := func(n *modelNode) bool {
		select {
		case <-n.s.Done():
			return false
		default:
			return true
		}
	}
	takeovers := 0
	for step := 0; step < steps; step++ {
		n := ns[rng.IntN(nodes)]
		p := uint32(rng.IntN(parts))
		if !n.cut && !live(n) {
			start(n) // its lease ended (expired while cut off, or closed): a new session
		}
		// Weights: acquire 7, release 3, cut 2, restore 3, close 1, takeover 4.
		ops := [...]int{0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 3, 4, 5, 5, 5, 5}
		switch op := ops[rng.IntN(len(ops))]; op {
		case 0: // acquire
			if n.cut {
				continue
			}
			o, err := n.s.Acquire(ctx, "t", p)
			switch {
			case err == nil:
				if n.owned[p] != o {
					granted(o)
					n.owned[p] = o
				}
			case errors.Is(err, ErrOwned), errors.Is(err, ErrLapsed), errors.Is(err, ErrLost),
				errors.Is(err, ErrUnavailable): // a connection the cut broke, noticed only now
			default:
				require.NoError(t, err)
			}
		case 1: // release
			if o := n.owned[p]; o != nil && !n.cut {
				if err := o.Release(ctx); err != nil {
					require.ErrorIs(t, err, ErrUnavailable)
				}
				require.ErrorIs(t, o.Check(), ErrLost)
				delete(n.owned, p)
			}
		case 2: // cut, leaving at least one node on the network
			cut := 0
			for _, m := range ns {
				if m.cut {
					cut++
				}
			}
			if !n.cut && cut < nodes-1 {
				n.p.Cut(true)
				n.cut = true
			}
		case 3: // restore
			if n.cut {
				n.p.Cut(false)
				n.cut = false
			}
		case 4: // close
			if !n.cut {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				if err := n.s.Close(cctx); err != nil {
					require.ErrorIs(t, err, ErrUnavailable) // the lease expires on its own
				}
				cancel()
				for _, o := range n.owned {
					require.ErrorIs(t, o.Check(), ErrSessionClosed)
				}
				start(n)
			}
		case 5: // takeover of a cut-off node's partition by a node on the network
			if takeovers >= takeoversMax {
				continue
			}
			var from, to *modelNode
			for _, m := range ns {
				if m.cut && m.owned[p] != nil && from == nil {
					from = m
				}
				if !m.cut && to == nil {
					to = m
				}
			}
			if from == nil || to == nil {
				continue
			}
			// Only if etcd says from still holds it (it may have lost it meanwhile, and a
			// live node hold it now: then there is nothing to take over).
			h, ok, err := c.Owner(ctx, "t", p)
			require.NoError(t, err)
			if !ok || h.Owner != from.id || h.Epoch != from.owned[p].Epoch() {
				delete(from.owned, p)
				continue
			}
			takeovers++
			o, err := to.s.AcquireWait(ctx, "t", p)
			if errors.Is(err, ErrLost) { // to's own lease ended under load: try once more
				start(to)
				o, err = to.s.AcquireWait(ctx, "t", p)
			}
			require.NoError(t, err)
			granted(o)
			to.owned[p] = o
			delete(from.owned, p)
		}
	}
	for _, n := range ns {
		n.p.Cut(false)
	}
	total := 0
	for _, g := range grants {
		total += len(g)
	}
	t.Logf("%d grants, %d takeovers", total, takeovers)
}
