package server

// fileLimit reports the handles a Windows process may open: Windows has no RLIMIT_NOFILE, and
// a process's handle table holds up to 2^24 handles, far beyond MaxConns and MaxTables.
func fileLimit() (uint64, error) { return 1 << 24, nil }
