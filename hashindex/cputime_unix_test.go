//go:build unix

package hashindex_test

import (
	"syscall"
	"time"
)

// processCPU is the process's user and system CPU time so far: per-op cost on a machine whose
// other processes take cores from the benchmark (its wall-clock ns/op then measures its share).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
