package main

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"

	"github.com/weftdb/weft/bench"
)

// keyOf encodes a row id as an 8-byte big-endian key, so keys sort in id order (sequential
// ids are neighbours in an LSM or a B+tree, as rows are in Weft's pages).
func keyOf(id uint64) []byte {
	k := make([]byte, 8)
	binary.BigEndian.PutUint64(k, id)
	return k
}

// loadChunk is how many rows a loading goroutine writes per batch.
const loadChunk = 1000

// loadParallel calls put for chunks of ids [first, first+spec.Records) from spec.Workers
// goroutines (bounded to 8: the peers' loads are write-bound) and reports progress.
func loadParallel(ctx context.Context, spec bench.LoadSpec, first uint64, put func(ids []uint64, rows [][]byte) error) error {
	var next atomic.Uint64
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	for range min(spec.Workers, 8) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := make([]uint64, 0, loadChunk)
			rows := make([][]byte, loadChunk)
			for i := range rows {
				rows[i] = make([]byte, spec.RowBytes)
			}
			for ctx.Err() == nil {
				lo := next.Add(loadChunk) - loadChunk
				if lo >= uint64(spec.Records) {
					return
				}
				hi := min(lo+loadChunk, uint64(spec.Records))
				ids = ids[:0]
				for i := lo; i < hi; i++ {
					id := first + i
					spec.Row(rows[len(ids)], id)
					ids = append(ids, id)
				}
				if err := put(ids, rows[:len(ids)]); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				spec.Progress(len(ids))
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}
