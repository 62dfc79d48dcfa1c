package testkit

import "testing"

// SkipUnderRace skips t in a build with the race detector. The multi-process kill and freeze
// suites call it: the race detector's slowdown stretches their leases and restarts past the
// budget (.ci/run's plain pass runs them, -race runs the in-process concurrency tests). suite
// names what skips, as "a kill suite (child processes)".
func SkipUnderRace(t testing.TB, suite string) {
	t.Helper()
	if RaceOn {
		t.Skip(suite + ": not under -race; the plain pass runs it")
	}
}
