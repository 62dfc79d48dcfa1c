//go:build race

package cluster

// raceOn reports a build with the race detector: the multi-process kill and freeze suites
// skip there (the race detector's slowdown stretches their leases and restarts past the
// budget; .ci/run's plain pass runs them, -race runs the in-process concurrency tests).
const raceOn = true
