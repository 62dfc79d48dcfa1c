package storenode

import (
	"bytes"
	"errors"
	"testing"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
)

// FuzzDecodeTxnExpiredRecord covers the decision expiry record (kindTxnExpired,
// records_repl.go): every input decodes to what re-encodes to the same bytes, or fails with
// a corruption error and names no decision.
func FuzzDecodeTxnExpiredRecord(f *testing.F) {
	f.Add(appendTxnExpiredRecord(nil, []expiredTxn{{id: base.TxnID{1, 15: 2}, lsn: 7}}))
	f.Add(appendTxnExpiredRecord(nil, []expiredTxn{{id: base.TxnID{1}, lsn: 7}, {id: base.TxnID{2}, lsn: 1 << 40}}))
	f.Add(appendTxnExpiredRecord(nil, []expiredTxn{{id: base.TxnID{3}, lsn: 0}}))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		var got []expiredTxn
		err := decodeTxnExpiredRecord(in, func(x expiredTxn) { got = append(got, x) })
		if err != nil {
			if !errors.Is(err, corrupt.ErrCorruption) {
				t.Fatalf("not a corruption error: %v", err)
			}
			if len(got) != 0 {
				t.Fatalf("a refused record named %d decisions", len(got))
			}
			return
		}
		if again := appendTxnExpiredRecord(nil, got); !bytes.Equal(again, in) {
			t.Fatalf("re-encodes differently:\n got %x\nwant %x", again, in)
		}
	})
}
