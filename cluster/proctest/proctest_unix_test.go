//go:build unix

package proctest

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const helperEnv = "WEFT_PROCTEST_HELPER"

// TestHelperCounter is the child of TestFreeze: it prints 0, 1, 2, ... as fast as its stdout
// takes them (a full pipe blocks it), from two goroutines taking turns, until stdin closes.
func TestHelperCounter(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("helper process only")
	}
	in := ChildInput()
	seq := make(chan int, 1)
	seq <- 0
	done := make(chan struct{})
	for range 2 {
		go func() {
			for {
				select {
				case <-done:
					return
				case i := <-seq:
					Printf("%d", i)
					if i%7 == 0 {
						time.Sleep(50 * time.Microsecond) // the printing's pace, now and then, not synchronisation
					}
					seq <- i + 1
				}
			}
		}()
	}
	for range in {
	}
	close(done)
}

// Freeze returns every line the child printed before it stopped: the lines after the resume
// continue the sequence exactly, and nothing arrives while it is stopped; StopMarked's marker
// sits between the lines before and after. Run several rounds on a child printing flat out,
// where a line in the pipe at the stop is the rule.
func TestFreeze(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := Start(t, Spec{Name: "counter", Test: "TestHelperCounter", Env: []string{helperEnv + "=1"}, Ready: "0"})
	next := 1
	check := func(l string) {
		t.Helper()
		v, err := strconv.Atoi(l)
		require.NoError(t, err, l)
		require.Equal(t, next, v, "the sequence broken")
		next++
	}
	for round := range 40 {
		for range 5 + round%7 {
			check(p.Line(ctx))
		}
		if round%2 == 0 {
			before, err := p.Freeze(ctx)
			if errors.Is(err, errors.ErrUnsupported) {
				t.Skip(err)
			}
			require.NoError(t, err)
			for _, l := range before {
				check(l)
			}
			// Nothing of the child's is left in flight: a line of ours written into its pipe
			// now is the next one read.
			require.NoError(t, waitStopped(ctx, p.Pid()))
			probe := "probe " + strconv.Itoa(round)
			require.NoError(t, writeStdout(p.Pid(), []byte(probe+"\n")))
			require.Equal(t, probe, p.Line(ctx), "round %d: a line the child printed before Freeze returned came after it", round)
		} else {
			marker, err := p.StopMarked(ctx)
			if errors.Is(err, errors.ErrUnsupported) {
				t.Skip(err)
			}
			require.NoError(t, err)
			require.True(t, strings.HasPrefix(marker, MarkerPrefix))
			for l := p.Line(ctx); l != marker; l = p.Line(ctx) {
				check(l)
			}
		}
		p.Cont()
	}
	require.NoError(t, p.CloseInput())
	require.NoError(t, p.Wait(ctx))
}
