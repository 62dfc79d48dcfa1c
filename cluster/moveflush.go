package cluster

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weftdb/weft/internal/corrupt"
)

// A move's flush request (docs/cluster.md, "Writes during a move"). Before it freezes the
// source, a mover asks the partition's holder to flush: a WriteBack owner's acknowledged
// writes may still be only in its cache, and the frozen source would refuse them. Two keys
// beside the owner key:
//
//	<prefix>own/<t>/<p>/flush     request: the mover epoch asking (no lease: it stays until
//	                              the mover ends it after the move or its rollback, or the
//	                              table is dropped)
//	<prefix>own/<t>/<p>/flushed   answer: the mover epoch answered and the grant (the owner
//	                              key's create revision) whose writes are flushed, bound to
//	                              the holder's lease
//
//	flush (20 bytes)    0 u8 version (1)  1 u8 kind (5)  2 [6] reserved (0)
//	                    8 i64 mover epoch  16 u32 crc32c of bytes 0..16
//	flushed (28 bytes)  0 u8 version (1)  1 u8 kind (6)  2 [6] reserved (0)
//	                    8 i64 mover epoch  16 i64 grant  24 u32 crc32c of bytes 0..24
//
// Rules:
//   - the holder, from the request on, refuses its writes of the partition (never
//     acknowledged: retried), flushes what it acknowledged, then answers; it writes the
//     partition again only once the request is gone and its map shows where the partition
//     is (cluster/node);
//   - the mover freezes only once the holder answered its epoch, or no grant is held (a
//     holder that died lost its unflushed writes with it, as in a crash), or the holder
//     does not write back (its owner value's flag: every write it acknowledged is durable).
const (
	kindFlush   = 5
	kindFlushed = 6
)

// flushWatchRetry is the pause before WaitFlushed reads again after its watch broke.
const flushWatchRetry = 100 * time.Millisecond

const (
	flushSuffix   = "/flush"
	flushedSuffix = "/flushed"
)

func (k keys) flush(t string, p uint32) string   { return k.owner(t, p) + flushSuffix }
func (k keys) flushed(t string, p uint32) string { return k.owner(t, p) + flushedSuffix }

// flushOwnerKey returns the owner key a flush request key belongs to.
func flushOwnerKey(key string) (string, bool) {
	return strings.CutSuffix(key, flushSuffix)
}

func encodeFlush(epoch int64) []byte {
	b := make([]byte, 0, 20)
	b = append(b, valueVersion, kindFlush, 0, 0, 0, 0, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(epoch))
	return appendCRC(b)
}

func decodeFlush(b []byte) (int64, error) {
	if err := checkValue(b, kindFlush, 20); err != nil {
		return 0, err
	}
	epoch := int64(binary.LittleEndian.Uint64(b[8:]))
	if len(b) != 20 || binary.LittleEndian.Uint64(b[:8])>>16 != 0 || epoch <= 0 {
		return 0, corrupt.Errorf("cluster: flush value of %d bytes, mover epoch %d", len(b), epoch)
	}
	return epoch, nil
}

func encodeFlushed(epoch, grant int64) []byte {
	b := make([]byte, 0, 28)
	b = append(b, valueVersion, kindFlushed, 0, 0, 0, 0, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(epoch))
	b = binary.LittleEndian.AppendUint64(b, uint64(grant))
	return appendCRC(b)
}

func decodeFlushed(b []byte) (epoch, grant int64, err error) {
	if err := checkValue(b, kindFlushed, 28); err != nil {
		return 0, 0, err
	}
	epoch, grant = int64(binary.LittleEndian.Uint64(b[8:])), int64(binary.LittleEndian.Uint64(b[16:]))
	if len(b) != 28 || binary.LittleEndian.Uint64(b[:8])>>16 != 0 || epoch <= 0 || grant <= 0 {
		return 0, 0, corrupt.Errorf("cluster: flushed value of %d bytes, mover epoch %d, grant %d", len(b), epoch, grant)
	}
	return epoch, grant, nil
}

// RequestFlush asks the holder of move r's partition to flush, for mover epoch epoch: the
// request is written only while r is the recorded move (ErrMoveInProgress otherwise).
func (c *Client) RequestFlush(ctx context.Context, r MoveRecord, epoch int64) error {
	mk := c.keys.move(r.Table, r.Part)
	resp, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(mk), "=", string(encodeMove(r)))).
		Then(clientv3.OpPut(c.keys.flush(r.Table, r.Part), string(encodeFlush(epoch)))).Commit()
	if err != nil {
		return unavailable(fmt.Sprintf("ask the holder of table %q partition %d to flush", r.Table, r.Part), err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: table %q partition %d: the move is not this mover's any more", ErrMoveInProgress, r.Table, r.Part)
	}
	return nil
}

// EndFlush deletes the flush request of partition part of table and its answer, if the
// request is of mover epoch epoch or an earlier one (a mover's end of its move, after the
// source is live again or retired; a mover that took the move over ends its predecessor's
// request too): its holder writes the partition again. A later mover's request stays.
func (c *Client) EndFlush(ctx context.Context, table string, part uint32, epoch int64) error {
	fk := c.keys.flush(table, part)
	what := fmt.Sprintf("end the flush request of table %q partition %d", table, part)
	resp, err := c.cli.Get(ctx, fk)
	if err != nil {
		return unavailable(what, err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	kv := resp.Kvs[0]
	if e, err := decodeFlush(kv.Value); err == nil && e > epoch {
		return nil // a later mover's
	}
	// (A request that does not decode is no mover's of this version: ended as well.)
	_, err = c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(fk), "=", kv.ModRevision)).
		Then(clientv3.OpDelete(fk), clientv3.OpDelete(c.keys.flushed(table, part))).Commit()
	if err != nil {
		return unavailable(what, err)
	}
	return nil
}

// WaitFlushed waits until the holder of partition part of table has answered the flush
// request of mover epoch epoch, or no grant of it is held, or its holder does not write
// back (Holder.WriteBack); ctx bounds the wait (its error,
// wrapped, names the holder that did not answer).
func (c *Client) WaitFlushed(ctx context.Context, table string, part uint32, epoch int64) error {
	ok, fk := c.keys.owner(table, part), c.keys.flushed(table, part)
	for {
		resp, err := c.cli.Txn(ctx).Then(clientv3.OpGet(ok), clientv3.OpGet(fk)).Commit()
		if err != nil {
			return unavailable(fmt.Sprintf("read the flush answer of table %q partition %d", table, part), err)
		}
		owners, answers := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
		if len(owners) == 0 {
			return nil
		}
		holder, err := decodeOwner(owners[0].Value)
		if err != nil {
			return fmt.Errorf("cluster: table %q partition %d: owner key: %w", table, part, err)
		}
		if !holder.WriteBack {
			return nil // every write it acknowledged is durable
		}
		if len(answers) == 1 {
			e, grant, err := decodeFlushed(answers[0].Value)
			if err != nil {
				return fmt.Errorf("cluster: table %q partition %d: flush answer: %w", table, part, err)
			}
			if e == epoch && grant == owners[0].CreateRevision {
				return nil
			}
		}
		// Watch the owner key and the answer from after the read; any change: read again.
		wctx, cancel := context.WithCancel(ctx)
		wch := c.cli.Watch(clientv3.WithRequireLeader(wctx), ok, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		var failed bool
		select {
		case wr, open := <-wch:
			failed = !open || wr.Err() != nil
		case <-ctx.Done():
		}
		cancel()
		if failed {
			// The watch broke (no leader, compacted): read again after a pause, not at once.
			t := time.NewTimer(flushWatchRetry)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%w: table %q partition %d: its holder %d (%s) did not flush for the move: %w",
				ErrUnavailable, table, part, holder.Owner, holder.Addr, err)
		}
	}
}
