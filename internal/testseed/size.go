package testseed

import (
	"os"
	"testing"
)

// SoakEnv is the environment variable that asks for a soak run: set (and not "0"), every
// randomised or load suite that sizes itself with Scaled runs at its soak size.
const SoakEnv = "WEFT_SOAK"

// Soak reports whether WEFT_SOAK asks for a soak run.
func Soak() bool { return os.Getenv(SoakEnv) != "" && os.Getenv(SoakEnv) != "0" }

// Scaled returns a suite's size: short under -short (.ci/run's race pass), normal in its plain
// pass, soak under WEFT_SOAK. Call it from a test (testing.Short needs parsed flags).
func Scaled(short, normal, soak int) int {
	switch {
	case Soak():
		return soak
	case testing.Short():
		return short
	}
	return normal
}
