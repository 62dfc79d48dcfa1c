package cluster

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weftdb/weft/internal/corrupt"
)

// Partition moves (docs/cluster.md, "Moving a partition"). A move's progress is one etcd
// key, created by compare-and-set when the move starts and deleted when it ends:
//
//	<prefix>move/<t>/<p>   move: the partition's source and target, the table's creation
//	                       revision, the partition entry's revision when the move began, and
//	                       the etcd lease of the mover running it
//
//	move (36 + f + n bytes)
//	  0  u8  version (1)   1 u8 kind (4)   2 u16 source address length f (1..255)
//	  4  u16 target address length n (1..255)   6 u16 reserved (0)
//	  8  i64 table created revision   16 i64 partition entry revision at the start
//	  24 i64 the mover's lease
//	  32 f   source address   32+f n target address
//	  32+f+n u32 crc32c of bytes 0..32+f+n
//
// One move of a partition at a time, run by one mover at a time: BeginMove refuses another
// move, and the same move while its mover's lease lives; once that lease is gone (the mover
// died) the next mover takes the record over (a compare-and-set), and the record's etcd
// ModRevision is the mover epoch the target fences move writes with (a mover that lost the
// move, paused past its lease, cannot write over its successor's copy). The switch and the
// end compare the record's whole value, lease included.

const kindMove = 4

// ErrMoveInProgress is returned by BeginMove when another move of the partition is recorded.
var ErrMoveInProgress = errors.New("cluster: another move of the partition is in progress")

// MoveRecord is a partition move's etcd record.
type MoveRecord struct {
	Table string
	Part  uint32
	// Created is the table's creation revision (TableMap.Created).
	Created int64
	// Rev is the partition entry's revision when the move began (TableMap.Revs[p]): the
	// switch compares it.
	Rev int64
	// From and To are the source and target storage nodes.
	From, To string
	// Lease is the etcd lease of the mover running the move (Session.Lease).
	Lease int64
}

func (k keys) movePrefix() string { return k.prefix + "move/" }
func (k keys) move(t string, p uint32) string {
	return fmt.Sprintf("%s%s/%08x", k.movePrefix(), t, p)
}

func encodeMove(r MoveRecord) []byte {
	b := make([]byte, 0, 36+len(r.From)+len(r.To))
	b = append(b, valueVersion, kindMove)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(r.From)))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(r.To)))
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(r.Created))
	b = binary.LittleEndian.AppendUint64(b, uint64(r.Rev))
	b = binary.LittleEndian.AppendUint64(b, uint64(r.Lease))
	b = append(b, r.From...)
	b = append(b, r.To...)
	return appendCRC(b)
}

// decodeMove decodes a move value; the caller sets Table and Part from the key.
func decodeMove(b []byte) (MoveRecord, error) {
	if err := checkValue(b, kindMove, 36); err != nil {
		return MoveRecord{}, err
	}
	f, n := int(binary.LittleEndian.Uint16(b[2:])), int(binary.LittleEndian.Uint16(b[4:]))
	if f == 0 || n == 0 || f > addrBytesMax || n > addrBytesMax || len(b) != 36+f+n || binary.LittleEndian.Uint16(b[6:]) != 0 {
		return MoveRecord{}, corrupt.Errorf("cluster: move value: addresses of %d and %d bytes in a %d-byte value", f, n, len(b))
	}
	r := MoveRecord{Created: int64(binary.LittleEndian.Uint64(b[8:])), Rev: int64(binary.LittleEndian.Uint64(b[16:])),
		Lease: int64(binary.LittleEndian.Uint64(b[24:])), From: string(b[32 : 32+f]), To: string(b[32+f : 32+f+n])}
	if r.Created <= 0 || r.Rev <= 0 {
		return MoveRecord{}, corrupt.Errorf("cluster: move value: revisions %d, %d", r.Created, r.Rev)
	}
	return r, nil
}

func (r MoveRecord) validate() error {
	if err := validTableName(r.Table); err != nil {
		return err
	}
	if err := validAddr(r.From, false); err != nil {
		return err
	}
	if err := validAddr(r.To, false); err != nil {
		return err
	}
	if r.Created <= 0 || r.Rev <= 0 || r.From == r.To {
		return fmt.Errorf("%w: move of %q partition %d from %s to %s (revisions %d, %d)", ErrInvalid, r.Table, r.Part, r.From, r.To, r.Created, r.Rev)
	}
	return nil
}

// BeginMove records move r (r.Lease: the calling mover's lease) and returns the mover epoch
// (the record's ModRevision). A recorded move of another source, target or revisions is
// returned with ErrMoveInProgress; the same move recorded by r.Lease (a retry) is adopted;
// the same move recorded by another mover is ErrMoveInProgress while that mover's lease
// lives, and taken over (compare-and-set of its value) once it is gone.
func (c *Client) BeginMove(ctx context.Context, r MoveRecord) (MoveRecord, int64, error) {
	if err := r.validate(); err != nil {
		return MoveRecord{}, 0, err
	}
	if r.Lease == 0 {
		return MoveRecord{}, 0, fmt.Errorf("%w: a move without the mover's lease", ErrInvalid)
	}
	k := c.keys.move(r.Table, r.Part)
	what := fmt.Sprintf("record the move of table %q partition %d", r.Table, r.Part)
	resp, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(encodeMove(r)))).Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return MoveRecord{}, 0, unavailable(what, err)
	}
	if resp.Succeeded {
		return r, resp.Header.Revision, nil
	}
	rr := resp.Responses[0].GetResponseRange()
	if rr == nil || len(rr.Kvs) == 0 {
		return MoveRecord{}, 0, fmt.Errorf("%w: move record of table %q partition %d vanished: try again", ErrMoveInProgress, r.Table, r.Part)
	}
	kv := rr.Kvs[0]
	got, err := decodeMove(kv.Value)
	if err != nil {
		return MoveRecord{}, 0, err
	}
	got.Table, got.Part = r.Table, r.Part
	mine := got
	mine.Lease = r.Lease
	if mine != r {
		return got, 0, fmt.Errorf("%w: table %q partition %d moving from %s to %s", ErrMoveInProgress, r.Table, r.Part, got.From, got.To)
	}
	if got.Lease == r.Lease {
		return got, kv.ModRevision, nil
	}
	alive, err := c.LeaseAlive(ctx, got.Lease)
	if err != nil {
		return MoveRecord{}, 0, err
	}
	if alive {
		return got, 0, fmt.Errorf("%w: table %q partition %d: its mover (lease %x) is alive", ErrMoveInProgress, r.Table, r.Part, got.Lease)
	}
	resp, err = c.cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(k), "=", string(kv.Value))).
		Then(clientv3.OpPut(k, string(encodeMove(r)))).Commit()
	if err != nil {
		return MoveRecord{}, 0, unavailable(what, err)
	}
	if !resp.Succeeded {
		return got, 0, fmt.Errorf("%w: table %q partition %d: another mover took it over: try again", ErrMoveInProgress, r.Table, r.Part)
	}
	return r, resp.Header.Revision, nil
}

// ReadMove reads the recorded move of a partition (linearizable); ok false when none.
func (c *Client) ReadMove(ctx context.Context, table string, part uint32) (r MoveRecord, ok bool, err error) {
	if err := validTableName(table); err != nil {
		return MoveRecord{}, false, err
	}
	resp, err := c.cli.Get(ctx, c.keys.move(table, part))
	if err != nil {
		return MoveRecord{}, false, unavailable(fmt.Sprintf("read the move of table %q partition %d", table, part), err)
	}
	if len(resp.Kvs) == 0 {
		return MoveRecord{}, false, nil
	}
	r, err = decodeMove(resp.Kvs[0].Value)
	if err != nil {
		return MoveRecord{}, false, err
	}
	r.Table, r.Part = table, part
	return r, true, nil
}

// EndMove deletes a partition's move record if it is still r (done or rolled back), and
// reports whether it did (false: gone already, or another mover's now).
func (c *Client) EndMove(ctx context.Context, r MoveRecord) (bool, error) {
	k := c.keys.move(r.Table, r.Part)
	resp, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(k), "=", string(encodeMove(r)))).
		Then(clientv3.OpDelete(k)).Commit()
	if err != nil {
		return false, unavailable(fmt.Sprintf("end the move of table %q partition %d", r.Table, r.Part), err)
	}
	return resp.Succeeded, nil
}

// SwitchMoved is the switch of move r, one etcd transaction: partition r.Part points at r.To
// only if the table is still the one created at r.Created, the partition's entry still has
// revision r.Rev (nothing switched it since the move began), r is still the recorded move,
// and the partition's owner key is still the grant of epoch owner (0: no owner key). The
// owner key is kept: ownership never changes hands at a switch (docs/cluster.md, "Moving a
// partition"), so the owner's grant goes on at the target, whose grant floor (MoveFloor)
// accepts it, and no other node acquires the partition until the owner releases it or its
// lease ends. It returns the switch's revision (the partition entry's new revision);
// ErrMapChanged when a compare failed (nothing changed).
func (c *Client) SwitchMoved(ctx context.Context, r MoveRecord, owner uint64) (int64, error) {
	if err := r.validate(); err != nil {
		return 0, err
	}
	mk, ok := c.keys.move(r.Table, r.Part), c.keys.owner(r.Table, r.Part)
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(c.keys.table(r.Table)), "=", r.Created),
		clientv3.Compare(clientv3.ModRevision(c.keys.part(r.Table, r.Part)), "=", r.Rev),
		clientv3.Compare(clientv3.Value(mk), "=", string(encodeMove(r))),
		clientv3.Compare(clientv3.CreateRevision(ok), "=", int64(owner)),
	}
	resp, err := c.cli.Txn(ctx).If(cmps...).Then(clientv3.OpPut(c.keys.part(r.Table, r.Part), string(encodePartition(r.To)))).Commit()
	if err != nil {
		return 0, unavailable(fmt.Sprintf("switch table %q partition %d", r.Table, r.Part), err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("%w: table %q partition %d changed since the move began (entry revision %d, owner epoch %d)",
			ErrMapChanged, r.Table, r.Part, r.Rev, owner)
	}
	return resp.Header.Revision, nil
}

// MoveFloor returns the grant floor a switched move's target is activated with
// (storenode's MoveActivate: grants of an epoch above the floor are taken), from one
// linearizable read of the partition entry and its owner key, taken after the switch:
//
//   - an owner key (the grant the switch kept, created before it: the switch compared it;
//     or one created since) makes the floor its epoch minus one: that grant, and only it or
//     a later one, is taken at the target (every earlier grant has ended: epochs increase);
//   - no owner key makes the floor the read's revision: every grant made up to the read has
//     ended (the kept one, and any made after the switch and ended since), and is fenced.
//
// Every read after the switch gives a floor that fences exactly the grants that ended before
// it, so a mover that resumes a switched move may read it again; the target's copy is
// activated once (a live copy is not activated again: node's mover checks). It returns
// ErrMapChanged when the partition is not on r.To (not switched, or switched again).
func (c *Client) MoveFloor(ctx context.Context, r MoveRecord) (uint64, error) {
	pk, ok := c.keys.part(r.Table, r.Part), c.keys.owner(r.Table, r.Part)
	resp, err := c.cli.Txn(ctx).Then(clientv3.OpGet(c.keys.table(r.Table), clientv3.WithKeysOnly()), clientv3.OpGet(pk), clientv3.OpGet(ok, clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return 0, unavailable(fmt.Sprintf("read the grant floor of table %q partition %d", r.Table, r.Part), err)
	}
	tk, pe, oe := resp.Responses[0].GetResponseRange(), resp.Responses[1].GetResponseRange(), resp.Responses[2].GetResponseRange()
	if tk == nil || pe == nil || oe == nil || len(tk.Kvs) != 1 || tk.Kvs[0].CreateRevision != r.Created || len(pe.Kvs) != 1 {
		return 0, fmt.Errorf("%w: table %q partition %d: not the table the move began on", ErrMapChanged, r.Table, r.Part)
	}
	to, err := decodePartition(pe.Kvs[0].Value)
	if err != nil {
		return 0, err
	}
	if to != r.To {
		return 0, fmt.Errorf("%w: table %q partition %d is on %s, not the move's target %s", ErrMapChanged, r.Table, r.Part, to, r.To)
	}
	if len(oe.Kvs) == 1 {
		return uint64(oe.Kvs[0].CreateRevision) - 1, nil
	}
	return uint64(resp.Header.Revision), nil
}
