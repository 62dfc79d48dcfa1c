package txnode

import (
	"context"
	"fmt"
	"sync"
)

// RowCodec converts a game's row struct to and from its fixed-size row bytes: little-endian
// fields at fixed offsets, written by hand (no reflection on the hot path). MarshalRow writes
// exactly the row size; UnmarshalRow reads it.
type RowCodec[T any] interface {
	RowBytes() int
	MarshalRow(dst []byte, v *T)
	UnmarshalRow(src []byte, v *T)
}

// TypedTable is a Table whose rows are values of T.
type TypedTable[T any] struct {
	t     *Table
	codec RowCodec[T]
	bufs  sync.Pool // *[]byte of the row size
}

// Typed wraps table with codec; the codec's row size must be the table's.
func Typed[T any](table *Table, codec RowCodec[T]) (*TypedTable[T], error) {
	if codec.RowBytes() != table.RowBytes() {
		return nil, fmt.Errorf("%w: codec writes %d bytes, table %q has %d-byte rows", ErrRowSize, codec.RowBytes(), table.Name(), table.RowBytes())
	}
	tt := &TypedTable[T]{t: table, codec: codec}
	tt.bufs.New = func() any { b := make([]byte, table.RowBytes()); return &b }
	return tt, nil
}

// Table returns the underlying table.
func (tt *TypedTable[T]) Table() *Table { return tt.t }

// Get reads row id into v.
func (tt *TypedTable[T]) Get(ctx context.Context, id uint64, v *T) error {
	b := tt.bufs.Get().(*[]byte)
	defer tt.bufs.Put(b)
	if err := tt.t.Get(ctx, id, *b); err != nil {
		return err
	}
	tt.codec.UnmarshalRow(*b, v)
	return nil
}

// Insert adds v under a new id.
func (tt *TypedTable[T]) Insert(ctx context.Context, v *T) (uint64, error) {
	b := tt.bufs.Get().(*[]byte)
	defer tt.bufs.Put(b)
	tt.codec.MarshalRow(*b, v)
	return tt.t.Insert(ctx, *b)
}

// Put replaces row id with v.
func (tt *TypedTable[T]) Put(ctx context.Context, id uint64, v *T) error {
	b := tt.bufs.Get().(*[]byte)
	defer tt.bufs.Put(b)
	tt.codec.MarshalRow(*b, v)
	return tt.t.Put(ctx, id, *b)
}

// Delete deletes row id.
func (tt *TypedTable[T]) Delete(ctx context.Context, id uint64) error { return tt.t.Delete(ctx, id) }

// TxGet reads row id into v inside tx.
func (tt *TypedTable[T]) TxGet(tx *Tx, id uint64, v *T) error {
	b := tt.bufs.Get().(*[]byte)
	defer tt.bufs.Put(b)
	if err := tx.Get(tt.t, id, *b); err != nil {
		return err
	}
	tt.codec.UnmarshalRow(*b, v)
	return nil
}

// TxPut replaces row id with v inside tx.
func (tt *TypedTable[T]) TxPut(tx *Tx, id uint64, v *T) error {
	b := tt.bufs.Get().(*[]byte)
	defer tt.bufs.Put(b)
	tt.codec.MarshalRow(*b, v)
	return tx.Put(tt.t, id, *b)
}

// TxInsert adds v under a new id inside tx.
func (tt *TypedTable[T]) TxInsert(tx *Tx, v *T) (uint64, error) {
	b := tt.bufs.Get().(*[]byte)
	defer tt.bufs.Put(b)
	tt.codec.MarshalRow(*b, v)
	return tx.Insert(tt.t, *b)
}

// TxUpdate reads row id into a T, calls fn, and writes the result inside tx.
func (tt *TypedTable[T]) TxUpdate(tx *Tx, id uint64, fn func(v *T) error) error {
	return tx.Update(tt.t, id, func(row []byte) error {
		var v T
		tt.codec.UnmarshalRow(row, &v)
		if err := fn(&v); err != nil {
			return err
		}
		tt.codec.MarshalRow(row, &v)
		return nil
	})
}
