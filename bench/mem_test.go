package bench

import (
	"context"
	"errors"
	"sync"
)

// memBackend is the in-memory Backend of the tests: a map under one mutex, with an
// asynchronous session whose ops complete at once.
type memBackend struct {
	mu       sync.Mutex
	rows     map[uint64][]byte
	next     uint64
	rowBytes int
	closed   bool
}

var errMemNotFound = errors.New("mem: not found")

func newMemBackend(rowBytes int) *memBackend {
	return &memBackend{rows: map[uint64][]byte{}, next: 100, rowBytes: rowBytes}
}

func (m *memBackend) Load(_ context.Context, spec LoadSpec) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	first := m.next
	for i := range spec.Records {
		row := make([]byte, spec.RowBytes)
		spec.Row(row, first+uint64(i))
		m.rows[first+uint64(i)] = row
	}
	m.next += uint64(spec.Records)
	spec.Progress(spec.Records)
	return first, nil
}

func (m *memBackend) Insert(_ context.Context, row []byte) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	id := m.next
	m.next++
	m.rows[id] = append([]byte(nil), row...)
	return id, nil
}

func (m *memBackend) Get(_ context.Context, id uint64, dst []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	row, ok := m.rows[id]
	if !ok {
		return errMemNotFound
	}
	copy(dst, row)
	return nil
}

func (m *memBackend) Update(_ context.Context, id uint64, fn func([]byte) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	row, ok := m.rows[id]
	if !ok {
		return errMemNotFound
	}
	c := append([]byte(nil), row...)
	if err := fn(c); err != nil {
		return err
	}
	m.rows[id] = c
	return nil
}

func (m *memBackend) Delete(_ context.Context, id uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.rows[id]; !ok {
		return errMemNotFound
	}
	delete(m.rows, id)
	return nil
}

func (m *memBackend) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return Stats{HasCache: true, WALBytes: uint64(len(m.rows))}
}

func (m *memBackend) Close() error {
	m.closed = true
	return nil
}

func (m *memBackend) NewSession() AsyncSession { return memSession{m} }

type memSession struct{ m *memBackend }

func (s memSession) Insert(ctx context.Context, row []byte) (uint64, Pending) {
	id, err := s.m.Insert(ctx, row)
	return id, donePending{err}
}

func (s memSession) Get(ctx context.Context, id uint64, dst []byte) Pending {
	return donePending{s.m.Get(ctx, id, dst)}
}

func (s memSession) Update(ctx context.Context, id uint64, fn func([]byte) error) Pending {
	return donePending{s.m.Update(ctx, id, fn)}
}

func (s memSession) Delete(ctx context.Context, id uint64) Pending {
	return donePending{s.m.Delete(ctx, id)}
}
