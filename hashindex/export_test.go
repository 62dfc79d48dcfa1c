package hashindex

import (
	"context"
)

// EntriesForTest verifies the index and returns every key's ids.
func (ix *Index) EntriesForTest(ctx context.Context) (Stats, map[string][]uint64, error) {
	return ix.verify(ctx, true)
}

// KeyHashForTest exposes the format's hash.
var KeyHashForTest = keyHash

// SetSaltForTest makes Create take its salt from salt (so a seeded test replays) until the
// test ends.
func SetSaltForTest(t interface{ Cleanup(func()) }, salt func() uint64) {
	old := newSalt
	newSalt = func() (uint64, error) { return salt(), nil }
	t.Cleanup(func() { newSalt = old })
}

// HoldDirForTest takes the directory refresh lock, as a refresh in progress would, and
// returns its release.
func (ix *Index) HoldDirForTest() func() {
	ix.dirMu <- struct{}{}
	return func() { <-ix.dirMu }
}

// InPrimaryForTest reports whether key is in its bucket's primary row (Lookup's fast path).
func (ix *Index) InPrimaryForTest(ctx context.Context, key []byte) (bool, error) {
	row := make([]byte, ix.fmt.rowBytes)
	_, v, err := ix.home(src{ctx: ctx}, keyHash(ix.fmt.salt, key), row)
	if err != nil {
		return false, err
	}
	for i := range v.count {
		if k, _ := ix.entry(v.body, i); string(k) == string(key) {
			return true, nil
		}
	}
	return false, nil
}

// LoseSplitForTest makes the directory snapshot what it would be after a split whose
// commit the index's table later lost (a WriteBack epoch the storage node refused, whose
// cached state txnode dropped): one bucket more than committed, at row id lost, which does
// not exist.
func (ix *Index) LoseSplitForTest(lost uint64) {
	c := ix.dir.Load()
	b := make([]dirSlot, c.n, c.n+1)
	for i := range b {
		b[i].id = c.slots[i].id
	}
	ix.dir.Store(&dirCache{n: c.n + 1, slots: append(b, dirSlot{id: lost}), dirRows: c.dirRows})
}
