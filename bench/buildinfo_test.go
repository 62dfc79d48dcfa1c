package bench

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestVCSStamp(t *testing.T) {
	for _, tc := range []struct {
		name     string
		settings []debug.BuildSetting
		want     string
		ok       bool
	}{
		{"none", nil, "", false},
		{"clean", []debug.BuildSetting{{Key: "vcs.revision", Value: "767c4541234567890abcdef"}, {Key: "vcs.modified", Value: "false"}}, "767c45412345", true},
		{"dirty", []debug.BuildSetting{{Key: "vcs.revision", Value: "767c454"}, {Key: "vcs.modified", Value: "true"}}, "767c454-dirty", true},
		{"modified without revision", []debug.BuildSetting{{Key: "vcs.modified", Value: "true"}}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := vcsStamp(tc.settings)
			require.Equal(t, tc.ok, ok)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestSourceCommitNeverEmpty(t *testing.T) {
	// From a checkout (go test does not stamp) this is git's answer; elsewhere "unknown (...)".
	require.NotEmpty(t, sourceCommit())
	require.NotContains(t, sourceCommit(), "uncommitted")
}
