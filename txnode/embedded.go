package txnode

import (
	"fmt"

	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode/store"
)

// The embedded store (Options.Dir): an engine in this process. This file and errors.go (the
// storage node's sentinels, re-exported) are the only ones of txnode that import the engine
// (storenode); everything else reaches the store through the seam, txnode/store. .ci/run
// checks it.

// ownerInUseLeaseFallback is the lease OwnerInUseWait's default assumes when the storage
// node's own cannot be read.
const ownerInUseLeaseFallback = storenode.DefaultLeaseDuration

// openEmbeddedStore opens the embedded store in opts.Dir, with opts' defaults applied
// (withDefaults): its sync mode, disk page cache and logger are opts', and it ends the leases
// of the owners it recorded at Open, as an embedded engine should
// (storenode.Options.ExpireLeasesAtOpen).
func openEmbeddedStore(opts Options) (store.Store, error) {
	sync, ok := storenode.ParseSyncMode(opts.SyncMode)
	if !ok {
		return nil, fmt.Errorf("txnode: sync mode %q: want always or none", opts.SyncMode)
	}
	return store.OpenEmbedded(storenode.Options{Dir: opts.Dir, Sync: sync, CacheBytes: opts.StoreCacheBytes,
		Logger: opts.Logger, ExpireLeasesAtOpen: true})
}
