package testkit

import (
	"os"
	"testing"
)

// HelperSpec returns what the parent test passed in env to this helper test, the child
// process it re-executes the test binary as (the repo's helper-process pattern). Run as a
// test (env unset), the helper does nothing: HelperSpec skips t, saying whose helper it is.
func HelperSpec(t testing.TB, env, parent string) string {
	t.Helper()
	spec := os.Getenv(env)
	if spec == "" {
		t.Skip("a helper process of " + parent + " only")
	}
	return spec
}
