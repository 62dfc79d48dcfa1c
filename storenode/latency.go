package storenode

import "github.com/weftdb/weft/internal/latency"

// engineLatencies are the engine's latency histograms (docs/operations.md, "Metrics").
type engineLatencies struct {
	walSync  latency.Histogram // each fdatasync of a WAL segment file
	readMiss latency.Histogram // each read of a page from its table's data file
}

// Latencies is a snapshot of the engine's latency histograms.
type Latencies struct {
	// WALSync is the time of each fdatasync of the WAL (a group commit's disk wait; none
	// under SyncNone but at checkpoints and segment rolls).
	WALSync latency.Snapshot
	// ReadMiss is the time of each page read from a data file (a disk page cache miss).
	ReadMiss latency.Snapshot
}

// Latencies returns the latency histograms' counts now. Any goroutine; no engine lock.
func (e *Engine) Latencies() Latencies {
	return Latencies{WALSync: e.lat.walSync.Snapshot(), ReadMiss: e.lat.readMiss.Snapshot()}
}
