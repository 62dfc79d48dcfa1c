package hashindex

import "context"

// EntriesForTest verifies the index and returns every key's ids.
func (ix *Index) EntriesForTest(ctx context.Context) (Stats, map[string][]uint64, error) {
	return ix.verify(ctx, true)
}

// KeyHashForTest exposes the format's hash.
var KeyHashForTest = keyHash
