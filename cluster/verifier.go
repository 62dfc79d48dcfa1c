package cluster

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// GrantVerifier is the storage node's check of the etcd grants its cluster-managed tables are
// registered with (storenode.GrantVerifier; docs/cluster.md, "The storage node: fencing by
// grant revision"): a storage node never takes an epoch on trust. cmd/storenode wires it when
// started with -etcd. Its methods may be called from any goroutine; each is one linearizable
// etcd read bounded by its context.
type GrantVerifier struct {
	c *Client
	// fenced is the error a refused grant wraps (storenode.ErrFenced, given by the caller:
	// package cluster does not import storenode).
	fenced error
}

// NewGrantVerifier returns a verifier reading c's owner keys. fenced is the error a grant
// that is not current wraps (storenode.ErrFenced), so the storage node tells a refused grant
// from etcd being unreachable.
func NewGrantVerifier(c *Client, fenced error) *GrantVerifier {
	return &GrantVerifier{c: c, fenced: fenced}
}

// VerifyGrant returns nil only when the owner key of partition part of table exists, was
// created at revision epoch and names owner (Client.Owner, a linearizable read). A grant that
// is not current wraps the verifier's fenced error; an unreachable etcd is ErrUnavailable.
func (v *GrantVerifier) VerifyGrant(ctx context.Context, table string, part uint32, owner, epoch uint64) error {
	h, ok, err := v.c.Owner(ctx, table, part)
	switch {
	case errors.Is(err, ErrInvalid):
		return fmt.Errorf("%w: %w", v.fenced, err)
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("cluster: table %q partition %d has no owner in etcd: %w", table, part, v.fenced)
	case h.Epoch != epoch || h.Owner != owner:
		// Never name the holder: the caller may be another owner.
		return fmt.Errorf("cluster: table %q partition %d: the grant of owner %d at revision %d is not the current one: %w",
			table, part, owner, epoch, v.fenced)
	}
	return nil
}

// Revision returns etcd's current revision, from a linearizable read: the floor of a restored
// copy's cluster tables.
func (v *GrantVerifier) Revision(ctx context.Context) (uint64, error) {
	// One key's count: the cheapest read; linearizable, as every read of the client.
	resp, err := v.c.cli.Get(ctx, v.c.keys.ownPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, unavailable("read etcd's revision", err)
	}
	if resp.Header == nil || resp.Header.Revision <= 0 {
		return 0, fmt.Errorf("%w: etcd answered without a revision", ErrUnavailable)
	}
	return uint64(resp.Header.Revision), nil
}

// TableMapped reports whether etcd's partition map has table, from a linearizable read
// (storenode.TableMapVerifier: a storage node lets an owner other than a cluster table's
// registered holder drop its copy only once the table is gone from the map). An invalid
// name is not in the map; an unreachable etcd is ErrUnavailable.
func (v *GrantVerifier) TableMapped(ctx context.Context, table string) (bool, error) {
	if err := validTableName(table); err != nil {
		return false, nil
	}
	resp, err := v.c.cli.Get(ctx, v.c.keys.table(table), clientv3.WithCountOnly())
	if err != nil {
		return false, unavailable("read table "+table+" in the partition map", err)
	}
	return resp.Count > 0, nil
}

// TxGrants is a transaction node's source of etcd grants (txncoord.Grants, given to
// txncoord.Open): each grant is the Session's Ownership of one partition, whose Check the
// transaction node calls in place of the storage node's lease. Package cluster does not import txnode; the method set
// is what txncoord.Grants asks for. Any goroutine may call it.
type TxGrants struct {
	// Session owns the partitions.
	Session *Session
	// Wait makes Grant wait (AcquireWait) while another node holds the partition, until its
	// owner key goes or ctx ends; otherwise Grant fails at once with an *OwnedError.
	Wait bool
}

// Grant acquires partition part of table under the session and returns the grant's epoch,
// its Check and its Release.
func (g *TxGrants) Grant(ctx context.Context, table string, part uint32) (uint64, func() error, func(context.Context) error, error) {
	var o *Ownership
	var err error
	if g.Wait {
		o, err = g.Session.AcquireWait(ctx, table, part)
	} else {
		o, err = g.Session.Acquire(ctx, table, part)
	}
	if err != nil {
		return 0, nil, nil, err
	}
	return o.Epoch(), o.Check, o.Release, nil
}

// MovePlace reads partition part of table's map entry and move record and etcd's revision
// in one linearizable read (storenode.MoveVerifier: a storage node checks each move step of
// a request against it): node is where the map places the partition ("" when it has no
// such entry); from, to and epoch the recorded move's source, target and mover epoch (the
// record's ModRevision), epoch 0 when none is recorded; revision etcd's at the read. An
// invalid name wraps the verifier's fenced error; an unreachable etcd is ErrUnavailable.
func (v *GrantVerifier) MovePlace(ctx context.Context, table string, part uint32) (node, from, to string, epoch, revision uint64, err error) {
	if err := validTableName(table); err != nil {
		return "", "", "", 0, 0, fmt.Errorf("%w: %w", v.fenced, err)
	}
	what := fmt.Sprintf("read the move of table %q partition %d", table, part)
	resp, err := v.c.cli.Txn(ctx).Then(clientv3.OpGet(v.c.keys.move(table, part)), clientv3.OpGet(v.c.keys.part(table, part))).Commit()
	if err != nil {
		return "", "", "", 0, 0, unavailable(what, err)
	}
	if resp.Header == nil || resp.Header.Revision <= 0 || len(resp.Responses) != 2 {
		return "", "", "", 0, 0, fmt.Errorf("%w: %s: etcd answered without a revision", ErrUnavailable, what)
	}
	mr, pr := resp.Responses[0].GetResponseRange(), resp.Responses[1].GetResponseRange()
	if mr == nil || pr == nil {
		return "", "", "", 0, 0, fmt.Errorf("%w: %s: etcd answered without the reads", ErrUnavailable, what)
	}
	if len(mr.Kvs) == 1 {
		r, err := decodeMove(mr.Kvs[0].Value)
		if err != nil {
			return "", "", "", 0, 0, err
		}
		from, to, epoch = r.From, r.To, uint64(mr.Kvs[0].ModRevision)
	}
	if len(pr.Kvs) == 1 {
		if node, err = decodePartition(pr.Kvs[0].Value); err != nil {
			return "", "", "", 0, 0, err
		}
	}
	return node, from, to, epoch, uint64(resp.Header.Revision), nil
}
