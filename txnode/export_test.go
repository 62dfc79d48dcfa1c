package txnode

import "testing"

// For the external test package (typed_test.go, example_test.go): the configurations.

// ConfigForTest is an openConfig as the external test package sees it.
type ConfigForTest struct {
	Name string
	// Opener binds a fresh store; every DB it opens sees the same data.
	Opener func(t testing.TB) func(Options) *DB
}

// ConfigsForTest returns openConfigs.
func ConfigsForTest(t testing.TB) []ConfigForTest {
	var out []ConfigForTest
	for _, c := range openConfigs(t) {
		out = append(out, ConfigForTest{Name: c.name, Opener: c.opener})
	}
	return out
}
