package bench

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestProcStatCPU(t *testing.T) {
	line := "4242 (crud bench) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 12 0 100 0 0\n"
	require.Equal(t, 3250*time.Millisecond, procStatCPU(line), "utime 250 + stime 75 ticks of 10ms")
	require.Zero(t, procStatCPU("garbage"))
	require.Zero(t, ProcessCPU(-1))
	_ = ProcessCPU(os.Getpid()) // readable, whatever its value
}
