// Package testseed is the one way to replay a randomised test: every randomised suite of the
// module (model tests, power-loss and crash suites, kill -9 cycles) prints its seed, and
// WEFT_SEED=<seed> replays it (decimal, or 0x hex), with -run naming the test or subtest that
// printed it. WEFT_SOAK=1 raises their sizes (Scaled: short under -short, normal in the plain
// pass, the soak size under WEFT_SOAK). Only tests import it.
package testseed

import (
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
)

// Env is the environment variable that names the seed to replay.
const Env = "WEFT_SEED"

// Replay returns the seed WEFT_SEED names, if any; a malformed value fails the test.
func Replay(t testing.TB) (uint64, bool) {
	t.Helper()
	s := os.Getenv(Env)
	if s == "" {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 0, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", Env, s, err)
	}
	return n, true
}

// Seed returns the seed WEFT_SEED names, else a fresh random one. The caller logs it.
func Seed(t testing.TB) uint64 {
	t.Helper()
	if n, ok := Replay(t); ok {
		return n
	}
	return rand.Uint64()
}
