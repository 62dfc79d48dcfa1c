package wal

import (
	"fmt"
	"time"

	"github.com/weftdb/weft/internal/latency"
)

// SyncMode says when the writer fdatasyncs a segment file.
type SyncMode uint8

const (
	// SyncAlways (the default) fdatasyncs every group before acknowledging it: an
	// acknowledged record survives power loss.
	SyncAlways SyncMode = iota
	// SyncNone acknowledges a record once written to the file (the OS page cache): it
	// survives kill -9 of the process, not power loss. Records appended with force=true are
	// still synced before they are acknowledged, and so is every record written before them.
	SyncNone
)

// String returns "always" or "none".
func (m SyncMode) String() string {
	switch m {
	case SyncAlways:
		return "always"
	case SyncNone:
		return "none"
	}
	return fmt.Sprintf("SyncMode(%d)", uint8(m))
}

// Defaults of Options.
const (
	// DefaultSegmentBytes is the default Options.SegmentBytes: 64 MiB.
	DefaultSegmentBytes = 64 << 20
	// DefaultMaxRecordBytes is the default Options.MaxRecordBytes: 64 MiB.
	DefaultMaxRecordBytes = 64 << 20
	// DefaultMaxQueueBytes is the default Options.MaxQueueBytes: 16 MiB.
	DefaultMaxQueueBytes = 16 << 20
	// DefaultGatherWaitMax caps the default gather wait (Options.GatherWait zero): 2 ms.
	DefaultGatherWaitMax = 2 * time.Millisecond
)

// Options configure a WAL. The zero value is valid: every zero field takes its default.
type Options struct {
	// Sync is the sync mode; the zero value is SyncAlways.
	Sync SyncMode
	// SegmentBytes is the target size of a segment file: once the active segment has
	// reached it, the next group goes to a new segment (so a segment exceeds it by at most
	// one group). 0 means DefaultSegmentBytes.
	SegmentBytes int64
	// MaxRecordBytes bounds the payload of one record, on append (ErrTooLarge) and on
	// recovery, where a longer length field marks a bad record before anything is
	// allocated. Never open a log with a smaller bound than it was written with. 0 means
	// DefaultMaxRecordBytes; at most 1 GiB.
	MaxRecordBytes int
	// MaxQueueBytes bounds the encoded records queued for the writer while it writes and
	// syncs the previous group. When it is reached, AppendAsync returns ErrBusy and Append
	// waits. A record larger than the bound is still admitted when the queue is empty.
	// 0 means DefaultMaxQueueBytes.
	MaxQueueBytes int
	// After is the LSN of the checkpoint the caller's state already covers: Open replays
	// only records with LSN > After, and segments wholly at or below it may be missing.
	// After must have been durable (at most a SyncedThrough value of an earlier run):
	// recovery reports a bad or missing record at or below After as corruption.
	After uint64
	// DurableThrough (>= After, or 0) is an LSN known to have been durable, e.g. the WAL's
	// synced-through LSN when the caller's last checkpoint was published: a bad record at or
	// below it is corruption, never a torn tail, even when no later record proves it.
	DurableThrough uint64

	// Gather turns on group gathering (SyncAlways only): before it cuts a group, the writer
	// waits for the appenders the previous synced group acknowledged to append again, so
	// that one fdatasync covers them and those that arrived during the previous sync, not
	// two alternating halves. It waits only while fewer records are queued than the
	// previous group plus those queued behind it, at most GatherWait. Off by default: it
	// measured faster where appenders come back at once (2.2x at 128 WAL appenders, 1.6x
	// for the engine's own committers) but slower end to end when they come back over TCP
	// (docs/wal.md, "Gathering").
	Gather bool
	// GatherWait bounds a gather's wait; zero means half the duration of the previous
	// fdatasync, at most DefaultGatherWaitMax.
	GatherWait time.Duration
	// SyncLatency, when set, records the time of every fdatasync of a segment file (the
	// storage node's weft_wal_fsync_seconds histogram).
	SyncLatency *latency.Histogram

	// noPreallocate turns off File.Allocate of the active segment (preallocate); benchmarks
	// compare both.
	noPreallocate bool
	// noYield turns off the writer's yield before taking a group; benchmarks compare both.
	noYield bool
}

// withDefaults returns o with zero fields set to their defaults, or an error wrapping
// ErrBadOptions.
func (o Options) withDefaults() (Options, error) {
	if o.SegmentBytes == 0 {
		o.SegmentBytes = DefaultSegmentBytes
	}
	if o.MaxRecordBytes == 0 {
		o.MaxRecordBytes = DefaultMaxRecordBytes
	}
	if o.MaxQueueBytes == 0 {
		o.MaxQueueBytes = DefaultMaxQueueBytes
	}
	switch {
	case o.Sync != SyncAlways && o.Sync != SyncNone:
		return o, fmt.Errorf("%w: sync mode %d", ErrBadOptions, o.Sync)
	case o.SegmentBytes < 0:
		return o, fmt.Errorf("%w: SegmentBytes %d", ErrBadOptions, o.SegmentBytes)
	case o.MaxRecordBytes < 0 || o.MaxRecordBytes > recordPayloadBytesMax:
		return o, fmt.Errorf("%w: MaxRecordBytes %d not in [0, %d]", ErrBadOptions, o.MaxRecordBytes, recordPayloadBytesMax)
	case o.MaxQueueBytes < 0:
		return o, fmt.Errorf("%w: MaxQueueBytes %d", ErrBadOptions, o.MaxQueueBytes)
	}
	return o, nil
}

// Record is a log record handed to the replay callback of Open.
type Record struct {
	// LSN is the record's log sequence number.
	LSN uint64
	// Kind is the kind byte given to Append.
	Kind byte
	// Payload is the record's payload. It is valid only during the callback: copy what
	// must outlive it.
	Payload []byte
	// Segment and Offset are where the record is: the first LSN of its segment file and its
	// byte offset there (a ReadRecords start that skips reading the segment from its start).
	Segment uint64
	Offset  int64
}

// Stats are counters of a WAL since Open.
type Stats struct {
	// Records is the number of records written.
	Records uint64
	// Bytes is the number of bytes written to segment files (records and segment headers).
	Bytes uint64
	// Groups is the number of group writes (one WriteAt each).
	Groups uint64
	// Syncs is the number of fdatasyncs of segment files.
	Syncs uint64
	// RecordsPerSync is Records / Syncs, 0 before the first sync.
	RecordsPerSync float64
}
