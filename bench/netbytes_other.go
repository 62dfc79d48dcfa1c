//go:build !linux

package bench

// TCPBytes is not measured off Linux (it reads TCP_INFO); reports show 0.
func TCPBytes(addr string) uint64 { return 0 }
