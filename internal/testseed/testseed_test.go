package testseed

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReplay(t *testing.T) {
	t.Setenv(Env, "")
	_, ok := Replay(t)
	require.False(t, ok)
	t.Setenv(Env, "0x10")
	n, ok := Replay(t)
	require.True(t, ok)
	require.Equal(t, uint64(16), n)
	require.Equal(t, uint64(16), Seed(t))
	t.Setenv(Env, "42")
	require.Equal(t, uint64(42), Seed(t))
}
