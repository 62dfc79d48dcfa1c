package txnode

import (
	"context"
	"runtime"
	"sync"

	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/logicpage"
)

// In-place reads (View). Get copies a row out of its cache frame with 64-bit atomic loads,
// then checks the row's version word: a seqlock read. View runs the caller's function
// between those two checks on the frame's bytes themselves, so a reader that looks at a few
// words of a large row (a hash index probing a 256-byte bucket for one key) does not pay for
// the copy. What it costs the caller:
//
//   - fn may run more than once: when the version check after it fails (a commit or a fill
//     changed the row, or the frame went to another page meanwhile), what it saw is thrown
//     away and it runs again on the row as it is now. So fn must have no effect but the
//     results it leaves in the caller's variables, each run overwriting the last.
//   - A run that is thrown away may have seen a row being overwritten: any mix of old and new
//     8-byte words (in place, no word is ever torn within itself). fn must not fail on any
//     bytes: it bounds-checks every length or offset it takes from the row before using it.
//   - The slice is valid only while fn runs. Keeping it (or a subslice, or a string or array
//     that aliases it through unsafe) past fn's return is a misuse: it is the cache's memory,
//     which later commits overwrite and eviction gives to other pages; under -race and the
//     weft_invariants tag it is a private copy that is poisoned when fn returns, so such a
//     misuse shows in tests. fn must not write to it either.
//
// A View in a transaction is recorded in the read set exactly like a Get (validated at
// commit, waited for durability at commit in Durable mode), and fn sees the transaction's own
// pending write of the row if it has one.
//
// The in-place form needs loads that are not reordered with later loads (the version check
// after fn): x86's memory model guarantees it. Elsewhere, and under the race detector (which
// would report the plain loads of fn against a committer's atomic stores, though the version
// check makes them harmless), fn gets a copy made with atomic loads.

// viewInPlace: fn reads the frame's bytes; otherwise a copy (see above).
const viewInPlace = !assert.Invariants && (runtime.GOARCH == "amd64" || runtime.GOARCH == "386")

// viewPoison is what a View's copy is overwritten with once fn returns (invariants builds).
const viewPoison = 0xA5

// viewBufs holds row buffers for Views that copy (not in place): *[RowBytesMax]byte.
var viewBufs = sync.Pool{New: func() any { return new([logicpage.RowBytesMax]byte) }}

// rowRead is what a single-row read does with the row it finds (Table.read, Tx.readRow),
// named by the function that made it, never by which argument is nil.
type rowRead struct {
	mode readMode
	dst  []byte                                 // readCopy's
	fn   func(row []byte) error                 // readView's
	fv   func(row []byte, version uint64) error // readViewVersion's
}

// readMode is a rowRead's.
type readMode uint8

const (
	readExists      readMode = iota // nothing taken: the read recorded (Delete's, Put's check)
	readCopy                        // the row copied into dst (Get)
	readView                        // fn called on the row (View)
	readViewVersion                 // fv called on the row and its version (ViewVersion)
)

// copyRow reads a row into dst, of the row size.
func copyRow(dst []byte) rowRead { return rowRead{mode: readCopy, dst: dst} }

// viewRow calls fn on the row (View's rules, above).
func viewRow(fn func(row []byte) error) rowRead { return rowRead{mode: readView, fn: fn} }

// viewRowVersion calls fv on the row and its version.
func viewRowVersion(fv func(row []byte, version uint64) error) rowRead {
	return rowRead{mode: readViewVersion, fv: fv}
}

// rowExists takes nothing of the row: the read says only whether it exists.
func rowExists() rowRead { return rowRead{mode: readExists} }

// view calls r's function on row (and, for ViewVersion, its version ver): in place, or on a
// copy (see viewInPlace). shared says row is a cache frame's (copied with atomic loads)
// rather than the transaction's own image.
func (r rowRead) view(row []byte, shared bool, ver uint64) error {
	if viewInPlace {
		if r.mode == readViewVersion {
			return r.fv(row, ver)
		}
		return r.fn(row)
	}
	b := viewBufs.Get().(*[logicpage.RowBytesMax]byte)
	cp := b[:len(row):len(row)]
	if shared {
		logicpage.LoadRow(cp, row)
	} else {
		copy(cp, row)
	}
	var err error
	if r.mode == readViewVersion {
		err = r.fv(cp, ver)
	} else {
		err = r.fn(cp)
	}
	if assert.Invariants {
		for i := range cp {
			cp[i] = viewPoison
		}
	}
	viewBufs.Put(b)
	return err
}

// View calls fn with row id as it is in the cache, without copying it out (Get copies): for
// a reader that needs a few fields of a large row. It returns ErrNotFound (fn not called)
// when the row does not exist, otherwise fn's error from the run that counted. Like Get it
// is a transaction of its own, lock-free on a cache hit (no syscall, no allocation, no lock);
// a miss fetches the row first. In Durable mode a row written by a commit not yet durable is
// shown to fn, but View returns only once that commit is durable: what fn saw counts only
// when View returns nil or fn's own error.
//
// fn runs on the calling goroutine, perhaps more than once, and must follow the rules of the
// package's in-place reads: no effect but its results (each run overwrites the last), no
// failure on any bytes (a run that is thrown away may see a row being overwritten), and row
// is valid only until fn returns: never keep it, never write to it. fn should be short and
// not wait: the longer it runs, the likelier a commit makes its run count for nothing.
func (t *Table) View(ctx context.Context, id uint64, fn func(row []byte) error) error {
	assert.That(fn != nil, "txnode: Table.View with a nil function")
	return t.read(ctx, id, viewRow(fn))
}

// ViewVersion is View with the row's version: fn gets the row and the version it had while
// fn ran (the run that counts saw exactly the bytes of that version). It is for a reader
// that remembers something it computed from a row (that its checksum is good) and wants to
// know, without reading the row's bytes again, that the row is the one it computed it from.
// Its rules are View's: any goroutine may call it, outside a transaction (it is in no
// transaction's read set: there is no Tx.ViewVersion); fn may run more than once, only the
// last run counts, and only once ViewVersion returned nil (so record what fn computed
// after it returns, never inside fn); row is valid only while fn runs; errors are View's
// (ErrNotFound without calling fn, fn's own error as it is). Example: ExampleTable_ViewVersion.
//
// A version identifies a row's bytes for the DB's life: two runs (of any goroutines) that
// get the same row id and the same version saw the same bytes. Versions come from the DB's
// monotonic commit counter, never reset: a commit gives every row it writes a version no
// earlier commit had, and a row fetched from the store (a miss, or a row refetched after
// eviction or after a failed batch invalidated it) gets the durable version at the fetch,
// and its bytes are the row's state as of that version (every commit up to it is
// acknowledged, so the store has it; a commit not yet acknowledged is in the cache, whose
// valid slots a fill never overwrites, or is waited for: see fetch). Transactions' validation
// already rests on it (a read is valid at commit if its version is unchanged). Once a commit
// batch failed, the store may hold a batch this node gave up on (applied, its acknowledgement
// lost), so the durable version no longer describes the store's bytes: a fetch then stamps a
// fresh version from the commit counter, past the failure (a Durable read of it returns the
// failure: the DB must be reopened anyway). The converse
// does not hold: a new version may carry the same bytes (a refetch, a Put of the same
// bytes). A version is meaningless across DBs, and across a reopen.
func (t *Table) ViewVersion(ctx context.Context, id uint64, fn func(row []byte, version uint64) error) error {
	assert.That(fn != nil, "txnode: Table.ViewVersion with a nil function")
	return t.read(ctx, id, viewRowVersion(fn))
}

// View calls fn with row id of table as the transaction sees it, without copying it out, and
// records the read like Get: a commit that changes the row before this transaction commits
// fails it with ErrConflict. It returns ErrNotFound (fn not called) when the row does not
// exist, otherwise fn's error. It sees the transaction's own writes. fn follows the rules of
// Table.View (it may run more than once; row is valid only until it returns); it must not
// use tx. Called by the goroutine running the Tx.
func (tx *Tx) View(table *Table, id uint64, fn func(row []byte) error) error {
	assert.That(fn != nil, "txnode: Tx.View with a nil function")
	if tx.done {
		return ErrTxDone
	}
	t := table.t
	if i := tx.findWrite(t.id, id); i >= 0 {
		w := &tx.writes[i]
		if w.off < 0 {
			return ErrNotFound
		}
		end := int(w.off) + t.rowBytes
		return viewRow(fn).view(tx.buf[w.off:end:end], false, 0)
	}
	ok, err := tx.readRow(t, id, viewRow(fn))
	if err != nil {
		return err
	}
	if !ok {
		return ErrNotFound
	}
	return nil
}
