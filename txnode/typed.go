package txnode

import (
	"context"
	"fmt"
	"iter"
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

// RowTable is a table of rows as a typed view needs it: a *Table, or a cluster table
// (cluster/node's *Table), whose single-row calls and scans have the same shape.
type RowTable interface {
	Name() string
	RowBytes() int
	Get(ctx context.Context, id uint64, dst []byte) error
	Insert(ctx context.Context, row []byte) (uint64, error)
	Put(ctx context.Context, id uint64, row []byte) error
	Update(ctx context.Context, id uint64, fn func(row []byte) error) error
	Delete(ctx context.Context, id uint64) error
	Scan(ctx context.Context, lo, hi uint64) iter.Seq2[Row, error]
	ScanAll(ctx context.Context) iter.Seq2[Row, error]
}

var _ RowTable = (*Table)(nil)

// TypedRows is a RowTable whose rows are values of T: its single-row calls and scans, each a
// transaction of its own. TypedTable adds the calls inside a Tx of a plain table.
type TypedRows[T any] struct {
	t     RowTable
	codec RowCodec[T]
	bufs  sync.Pool // *[]byte of the row size
}

// TypedTable is a Table whose rows are values of T: TypedRows, and the same calls inside a
// transaction (TxGet, TxPut, ...).
type TypedTable[T any] struct {
	*TypedRows[T]
	t *Table
}

// Typed wraps table with codec; the codec's row size must be the table's.
func Typed[T any](table *Table, codec RowCodec[T]) (*TypedTable[T], error) {
	rows, err := TypedOf(table, codec)
	if err != nil {
		return nil, err
	}
	return &TypedTable[T]{TypedRows: rows, t: table}, nil
}

// TypedOf wraps any RowTable (a cluster table: node.Table) with codec; the codec's row size
// must be the table's.
func TypedOf[T any](table RowTable, codec RowCodec[T]) (*TypedRows[T], error) {
	if codec.RowBytes() != table.RowBytes() {
		return nil, fmt.Errorf("%w: codec writes %d bytes, table %q has %d-byte rows", ErrRowSize, codec.RowBytes(), table.Name(), table.RowBytes())
	}
	tr := &TypedRows[T]{t: table, codec: codec}
	tr.bufs.New = func() any { b := make([]byte, table.RowBytes()); return &b }
	return tr, nil
}

// Table returns the underlying table.
func (tt *TypedTable[T]) Table() *Table { return tt.t }

// Get reads row id into v.
func (tt *TypedRows[T]) Get(ctx context.Context, id uint64, v *T) error {
	b := tt.bufs.Get().(*[]byte)
	defer tt.bufs.Put(b)
	if err := tt.t.Get(ctx, id, *b); err != nil {
		return err
	}
	tt.codec.UnmarshalRow(*b, v)
	return nil
}

// Insert adds v under a new id.
func (tt *TypedRows[T]) Insert(ctx context.Context, v *T) (uint64, error) {
	b := tt.bufs.Get().(*[]byte)
	defer tt.bufs.Put(b)
	tt.codec.MarshalRow(*b, v)
	return tt.t.Insert(ctx, *b)
}

// Put replaces row id with v.
func (tt *TypedRows[T]) Put(ctx context.Context, id uint64, v *T) error {
	b := tt.bufs.Get().(*[]byte)
	defer tt.bufs.Put(b)
	tt.codec.MarshalRow(*b, v)
	return tt.t.Put(ctx, id, *b)
}

// Delete deletes row id.
func (tt *TypedRows[T]) Delete(ctx context.Context, id uint64) error { return tt.t.Delete(ctx, id) }

// Update reads row id into a T, calls fn, and writes what fn leaves in it, as a transaction of
// its own (Table.Update): fn may run more than once (the transaction is retried on conflict),
// so it must not have other effects. If fn returns an error nothing is written and Update
// returns it; ErrNotFound when the row does not exist.
func (tt *TypedRows[T]) Update(ctx context.Context, id uint64, fn func(v *T) error) error {
	return tt.t.Update(ctx, id, func(row []byte) error { return tt.update(row, fn) })
}

// TypedRow is one row of a typed scan: its id and its value, decoded by the table's codec
// (a copy: it stays valid after the iteration moves on).
type TypedRow[T any] struct {
	ID    uint64
	Value T
}

// Scan returns the rows of ids in [lo, hi) in id order, decoded, like Table.Scan: each row is
// read consistently, the scan as a whole is not a snapshot (use TxScan for that). An error
// ends the sequence as its last element. Call it from any goroutine; the sequence is used by
// one.
func (tt *TypedRows[T]) Scan(ctx context.Context, lo, hi uint64) iter.Seq2[TypedRow[T], error] {
	return typedRows(tt.codec, tt.t.Scan(ctx, lo, hi))
}

// ScanAll returns every row of the table in id order, decoded: Scan over the whole id space
// (Table.ScanAll), with no bound to pick.
func (tt *TypedRows[T]) ScanAll(ctx context.Context) iter.Seq2[TypedRow[T], error] {
	return typedRows(tt.codec, tt.t.ScanAll(ctx))
}

// TxScan returns the rows of ids in [lo, hi) in id order, decoded, as part of tx (Tx.Scan):
// serializable, the transaction's own writes seen, phantoms caught at commit.
func (tt *TypedTable[T]) TxScan(tx *Tx, lo, hi uint64) iter.Seq2[TypedRow[T], error] {
	return typedRows(tt.codec, tx.Scan(tt.t, lo, hi))
}

// TxScanAll returns every row of the table in id order, decoded, as part of tx (Tx.ScanAll).
func (tt *TypedTable[T]) TxScanAll(tx *Tx) iter.Seq2[TypedRow[T], error] {
	return typedRows(tt.codec, tx.ScanAll(tt.t))
}

// typedRows decodes a scan's rows; Row.Data is only valid during its iteration, so each value
// is decoded before the next.
func typedRows[T any](codec RowCodec[T], rows iter.Seq2[Row, error]) iter.Seq2[TypedRow[T], error] {
	return func(yield func(TypedRow[T], error) bool) {
		for r, err := range rows {
			if err != nil {
				yield(TypedRow[T]{}, err)
				return
			}
			tr := TypedRow[T]{ID: r.ID}
			codec.UnmarshalRow(r.Data, &tr.Value)
			if !yield(tr, nil) {
				return
			}
		}
	}
}

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
	return tx.Update(tt.t, id, func(row []byte) error { return tt.update(row, fn) })
}

// update decodes row, calls fn and encodes the result back into row.
func (tt *TypedRows[T]) update(row []byte, fn func(v *T) error) error {
	var v T
	tt.codec.UnmarshalRow(row, &v)
	if err := fn(&v); err != nil {
		return err
	}
	tt.codec.MarshalRow(row, &v)
	return nil
}
