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
//	                       revision and the partition entry's revision when the move began
//
//	move (28 + f + n bytes)
//	  0  u8  version (1)   1 u8 kind (4)   2 u16 source address length f (1..255)
//	  4  u16 target address length n (1..255)   6 u16 reserved (0)
//	  8  i64 table created revision   16 i64 partition entry revision at the start
//	  24 f   source address   24+f n target address
//	  24+f+n u32 crc32c of bytes 0..24+f+n
//
// One move of a partition at a time (BeginMove refuses another); a mover that died leaves
// the key, and the next mover of the partition completes or rolls back what it says.

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
}

func (k keys) movePrefix() string { return k.prefix + "move/" }
func (k keys) move(t string, p uint32) string {
	return fmt.Sprintf("%s%s/%08x", k.movePrefix(), t, p)
}

func encodeMove(r MoveRecord) []byte {
	b := make([]byte, 0, 28+len(r.From)+len(r.To))
	b = append(b, valueVersion, kindMove)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(r.From)))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(r.To)))
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(r.Created))
	b = binary.LittleEndian.AppendUint64(b, uint64(r.Rev))
	b = append(b, r.From...)
	b = append(b, r.To...)
	return appendCRC(b)
}

// decodeMove decodes a move value; the caller sets Table and Part from the key.
func decodeMove(b []byte) (MoveRecord, error) {
	if err := checkValue(b, kindMove, 28); err != nil {
		return MoveRecord{}, err
	}
	f, n := int(binary.LittleEndian.Uint16(b[2:])), int(binary.LittleEndian.Uint16(b[4:]))
	if f == 0 || n == 0 || f > addrBytesMax || n > addrBytesMax || len(b) != 28+f+n || binary.LittleEndian.Uint16(b[6:]) != 0 {
		return MoveRecord{}, corrupt.Errorf("cluster: move value: addresses of %d and %d bytes in a %d-byte value", f, n, len(b))
	}
	r := MoveRecord{Created: int64(binary.LittleEndian.Uint64(b[8:])), Rev: int64(binary.LittleEndian.Uint64(b[16:])),
		From: string(b[24 : 24+f]), To: string(b[24+f : 24+f+n])}
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

// BeginMove records a move of r.Table's partition r.Part, only if none is recorded: it
// returns r. If one is recorded it returns that one with ErrMoveInProgress unless it is the
// same move (same source, target and revisions: a mover's retry), returned with no error.
func (c *Client) BeginMove(ctx context.Context, r MoveRecord) (MoveRecord, error) {
	if err := r.validate(); err != nil {
		return MoveRecord{}, err
	}
	k := c.keys.move(r.Table, r.Part)
	resp, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(encodeMove(r)))).Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return MoveRecord{}, unavailable(fmt.Sprintf("record the move of table %q partition %d", r.Table, r.Part), err)
	}
	if resp.Succeeded {
		return r, nil
	}
	rr := resp.Responses[0].GetResponseRange()
	if rr == nil || len(rr.Kvs) == 0 {
		return MoveRecord{}, fmt.Errorf("%w: move record of table %q partition %d vanished: try again", ErrMoveInProgress, r.Table, r.Part)
	}
	got, err := decodeMove(rr.Kvs[0].Value)
	if err != nil {
		return MoveRecord{}, err
	}
	got.Table, got.Part = r.Table, r.Part
	if got == r {
		return got, nil
	}
	return got, fmt.Errorf("%w: table %q partition %d moving from %s to %s", ErrMoveInProgress, r.Table, r.Part, got.From, got.To)
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

// EndMove deletes a partition's move record if it is still r (done or rolled back).
func (c *Client) EndMove(ctx context.Context, r MoveRecord) error {
	k := c.keys.move(r.Table, r.Part)
	_, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(k), "=", string(encodeMove(r)))).
		Then(clientv3.OpDelete(k)).Commit()
	if err != nil {
		return unavailable(fmt.Sprintf("end the move of table %q partition %d", r.Table, r.Part), err)
	}
	return nil
}

// SwitchMoved is the switch of move r, one etcd transaction: partition r.Part points at r.To
// only if the table is still the one created at r.Created, the partition's entry still has
// revision r.Rev (nothing switched it since the move began), r is still the recorded move,
// and the partition's owner key is still the grant of epoch owner (0: no owner key);
// that owner key is deleted in the same transaction, so the grant ends with the switch
// (the owner acquires again, a new key at a revision above the switch, which the target's
// floor accepts). It returns the switch's revision (the partition entry's new revision, the
// target's grant floor); ErrMapChanged when a compare failed (nothing changed).
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
	ops := []clientv3.Op{clientv3.OpPut(c.keys.part(r.Table, r.Part), string(encodePartition(r.To)))}
	if owner != 0 {
		ops = append(ops, clientv3.OpDelete(ok))
	}
	resp, err := c.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return 0, unavailable(fmt.Sprintf("switch table %q partition %d", r.Table, r.Part), err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("%w: table %q partition %d changed since the move began (entry revision %d, owner epoch %d)",
			ErrMapChanged, r.Table, r.Part, r.Rev, owner)
	}
	return resp.Header.Revision, nil
}
