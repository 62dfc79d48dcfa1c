//go:build race

package clustertest_test

// raceOn reports a build with the race detector: the kill suites skip there (too slow).
const raceOn = true
