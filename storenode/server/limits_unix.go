//go:build unix

package server

import (
	"fmt"
	"syscall"
)

// fileLimit reports RLIMIT_NOFILE's soft limit.
func fileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("storenode: read RLIMIT_NOFILE: %w", err)
	}
	return lim.Cur, nil
}
