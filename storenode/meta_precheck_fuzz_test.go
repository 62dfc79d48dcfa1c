package storenode

import (
	"errors"
	"testing"

	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
)

// FuzzPrecheckMeta: the streamed check of a large meta file (precheckMeta) never refuses a
// file decodeMeta accepts, and refuses only with decodeMeta's kind of error.
func FuzzPrecheckMeta(f *testing.F) {
	for _, s := range metaSeeds() {
		f.Add(s)
		f.Add(s[:len(s)/2])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < metaHeaderBytes+metaTrailerBytes {
			return // loadMeta streams only files over metaStreamBytes
		}
		ffs := vfs.NewFaultFS()
		if err := ffs.WriteFile("meta", b); err != nil {
			t.Fatal(err)
		}
		mf, err := ffs.Open("meta")
		if err != nil {
			t.Fatal(err)
		}
		defer mf.Close()
		perr := precheckMeta(mf, int64(len(b)))
		_, derr := decodeMeta(b)
		switch {
		case derr == nil && perr != nil:
			t.Fatalf("precheck refuses a meta file decodeMeta accepts: %v", perr)
		case perr != nil && errors.Is(perr, corrupt.ErrCorruption) != errors.Is(derr, corrupt.ErrCorruption) &&
			errors.Is(perr, ErrOldFormat) != errors.Is(derr, ErrOldFormat):
			t.Fatalf("precheck: %v; decodeMeta: %v", perr, derr)
		case perr != nil && !errors.Is(perr, corrupt.ErrCorruption) && !errors.Is(perr, ErrOldFormat):
			t.Fatalf("not a corruption error: %v", perr)
		}
	})
}
