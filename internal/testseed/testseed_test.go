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

func TestScaled(t *testing.T) {
	t.Setenv(SoakEnv, "")
	want := 2
	if testing.Short() {
		want = 1
	}
	require.Equal(t, want, Scaled(1, 2, 3))
	require.False(t, Soak())
	t.Setenv(SoakEnv, "0")
	require.False(t, Soak())
	t.Setenv(SoakEnv, "1")
	require.True(t, Soak())
	require.Equal(t, 3, Scaled(1, 2, 3))
}
