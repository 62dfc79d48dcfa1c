package main

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/weftdb/weft/bench"
)

// The in-memory upper bound: rows in a Go map guarded by sharded mutexes, nothing durable,
// no cache to miss. Each shard keeps its rows in one pointer-free arena (a map of id to slot),
// so the garbage collector has nothing to scan.

const mapShards = 512

var errMapNotFound = errors.New("map: row not found")

type mapShard struct {
	mu      sync.Mutex
	slots   map[uint64]uint32
	rows    []byte
	free    []uint32
	scratch []byte
	_       [64]byte // keep neighbouring shards' locks off one cache line
}

type mapBackend struct {
	rowBytes int
	shards   [mapShards]mapShard
	next     atomic.Uint64
}

func mapFactory() bench.Factory {
	return bench.Factory{
		Name: "map",
		Note: "Go map behind 512 mutex shards: in memory, nothing durable, ids from an atomic counter",
		Open: func(_ context.Context, cfg bench.OpenConfig) (bench.Backend, error) {
			m := &mapBackend{rowBytes: cfg.RowBytes}
			for i := range m.shards {
				m.shards[i].slots = make(map[uint64]uint32)
				m.shards[i].scratch = make([]byte, cfg.RowBytes)
			}
			return m, nil
		},
	}
}

func (m *mapBackend) shard(id uint64) *mapShard { return &m.shards[id%mapShards] }

// put stores row under id; the caller holds s.mu.
func (m *mapBackend) put(s *mapShard, id uint64, row []byte) {
	slot, ok := s.slots[id]
	if !ok {
		if n := len(s.free); n > 0 {
			slot, s.free = s.free[n-1], s.free[:n-1]
		} else {
			slot = uint32(len(s.rows) / m.rowBytes)
			s.rows = append(s.rows, make([]byte, m.rowBytes)...)
		}
		s.slots[id] = slot
	}
	copy(s.rows[int(slot)*m.rowBytes:], row)
}

func (m *mapBackend) Load(ctx context.Context, spec bench.LoadSpec) (uint64, error) {
	per := spec.Records/mapShards + 1
	for i := range m.shards {
		s := &m.shards[i]
		s.slots = make(map[uint64]uint32, per)
		s.rows = make([]byte, 0, per*m.rowBytes)
	}
	m.next.Store(uint64(spec.Records))
	return 0, loadParallel(ctx, spec, 0, func(ids []uint64, rows [][]byte) error {
		for i, id := range ids {
			s := m.shard(id)
			s.mu.Lock()
			m.put(s, id, rows[i])
			s.mu.Unlock()
		}
		return nil
	})
}

func (m *mapBackend) Insert(_ context.Context, row []byte) (uint64, error) {
	id := m.next.Add(1) - 1
	s := m.shard(id)
	s.mu.Lock()
	m.put(s, id, row)
	s.mu.Unlock()
	return id, nil
}

func (m *mapBackend) Get(_ context.Context, id uint64, dst []byte) error {
	s := m.shard(id)
	s.mu.Lock()
	slot, ok := s.slots[id]
	if ok {
		copy(dst, s.rows[int(slot)*m.rowBytes:(int(slot)+1)*m.rowBytes])
	}
	s.mu.Unlock()
	if !ok {
		return errMapNotFound
	}
	return nil
}

func (m *mapBackend) Update(_ context.Context, id uint64, fn func([]byte) error) error {
	s := m.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	slot, ok := s.slots[id]
	if !ok {
		return errMapNotFound
	}
	row := s.rows[int(slot)*m.rowBytes : (int(slot)+1)*m.rowBytes]
	copy(s.scratch, row)
	if err := fn(s.scratch); err != nil {
		return err
	}
	copy(row, s.scratch)
	return nil
}

func (m *mapBackend) Delete(_ context.Context, id uint64) error {
	s := m.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	slot, ok := s.slots[id]
	if !ok {
		return errMapNotFound
	}
	delete(s.slots, id)
	s.free = append(s.free, slot)
	return nil
}

func (m *mapBackend) Stats() bench.Stats { return bench.Stats{} }

func (m *mapBackend) Close() error { return nil }
