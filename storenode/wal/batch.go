package wal

import (
	"context"
	"errors"
	"fmt"

	"github.com/weftdb/weft/internal/assert"
)

// BatchRecord is one record of AppendBatch: a kind and a payload that is the concatenation of
// Payload's slices (copied during the call).
type BatchRecord struct {
	Kind    byte
	Payload [][]byte
}

// AppendBatch appends recs as consecutive records queued together, so that the writer takes
// them into one group (one write, at most one sync), and waits until the last is written (and
// synced, with SyncAlways or force), returning the LSN of the first. Either every record is
// queued or none is. A crash may still keep a prefix of them: the WAL's recovery rules hold
// per record. Errors and the context are as Append's; an empty recs returns LastLSN()+1 and
// nil. The payloads are copied during the call.
func (w *WAL) AppendBatch(ctx context.Context, recs []BatchRecord, force bool) (uint64, error) {
	if len(recs) == 0 {
		return w.LastLSN() + 1, nil
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	size := 0
	for i, r := range recs {
		n, _ := payloadBytes(r.Payload, nil)
		if n > w.opts.MaxRecordBytes {
			return 0, fmt.Errorf("%w: record %d of a batch: %d bytes, limit %d", ErrTooLarge, i, n, w.opts.MaxRecordBytes)
		}
		size += recordSize(n)
	}
	wt := waiterPool.Get().(*waiter)
	var first uint64
	for {
		w.mu.Lock()
		queuedBytes := len(w.queueBuf) + w.queueRefBytes
		spaceFreed, err := w.admitLocked(queuedBytes, size)
		if err == nil {
			wasEmpty := len(w.queue) == 0
			first = w.nextLSN
			for i, r := range recs {
				n, _ := payloadBytes(r.Payload, nil)
				done, f := batchDoneNone, false
				if i == len(recs)-1 {
					done, f = wt.done, force // the last record's sync covers the group
				}
				w.putLocked(r.Kind, r.Payload, nil, n, 0, f, done)
			}
			gathered := w.gatherAt > 0 && len(w.queue) >= w.gatherAt
			assert.That(queuedBytes+size <= w.opts.MaxQueueBytes || queuedBytes == 0, "wal: queue over its bound")
			w.mu.Unlock()
			if wasEmpty || gathered {
				w.signal()
			}
			break
		}
		w.mu.Unlock()
		if !errors.Is(err, ErrBusy) {
			waiterPool.Put(wt)
			return 0, err
		}
		select {
		case <-spaceFreed:
		case <-ctx.Done():
			waiterPool.Put(wt)
			return 0, ctx.Err()
		}
	}
	select {
	case r := <-wt.ch:
		waiterPool.Put(wt)
		if r.err != nil {
			return 0, r.err
		}
		assert.That(r.lsn == first+uint64(len(recs))-1, "wal: batch LSNs not consecutive")
		return first, nil
	case <-ctx.Done():
		// wt stays with the writer, which will send to it: it is not reused.
		return 0, fmt.Errorf("%w: %w", ErrUnknownOutcome, ctx.Err())
	}
}

// batchDoneNone is the done callback of every record of a batch but the last: the last one's
// outcome is the batch's (records are acknowledged in LSN order, and a failure fails every
// later record).
func batchDoneNone(uint64, error) {}
