//go:build !linux

package procinfo

import "os"

// FlockHolder is unknown off Linux.
func FlockHolder(os.FileInfo) (Process, bool) { return Process{}, false }

// ListenerHolder is unknown off Linux.
func ListenerHolder(int) (Process, bool) { return Process{}, false }
