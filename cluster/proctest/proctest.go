//go:build unix

// Package proctest runs child processes for crash and freeze tests: each child re-executes
// the test binary with -test.run selecting one helper test (a TestHelper... function that
// skips unless its environment variable is set: the repo's helper-process pattern), talks to
// the parent by lines (commands on its stdin, answers on its stdout) and is killed (SIGKILL),
// frozen (SIGSTOP), resumed (SIGCONT) and restarted with the same environment at will.
//
// No child outlives its test: Start registers a cleanup that kills it (SIGKILL ends a
// stopped process too), a child on Linux gets SIGKILL when the parent dies
// (Pdeathsig, for a parent that panics on -test.timeout, when no cleanup runs), and
// ChildInput's channel closes when the parent's end of stdin does, so a child's loop can end.
//
// Readiness is a line, never a sleep: Start waits, within Spec.ReadyTimeout, for the first
// line with the Spec.Ready prefix (when set) and returns it (Ready).
//
// What a child printed before a freeze is known exactly: Freeze and StopMarked (Linux) wait
// until every thread of the child is stopped and put a marker line into its stdout pipe, so
// every line before the marker was printed before the stop, every line after it after the
// resume.
//
// Only tests import this package (it is not linked into any production binary); it does not
// import package cluster, so that package's internal tests can use it as well as
// package cluster/clustertest, which builds storage-node and cluster-node children on it, and
// cluster/node's kill tests (their storage-node child and the cluster nodes they kill).
package proctest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// DefaultReadyTimeout bounds the wait for a child's ready line when Spec.ReadyTimeout is
// zero (a loaded 2-core machine can take seconds to start a test binary).
const DefaultReadyTimeout = 60 * time.Second

// linesMax bounds the lines a child may have printed that the parent has not read yet;
// beyond it the reader blocks, and so, through the pipe, does the child.
const linesMax = 4096

// Spec describes a child.
type Spec struct {
	// Name names the child in failures and logs.
	Name string
	// Test is the helper test the child runs (-test.run=^Test$).
	Test string
	// Env is added to the parent's environment, KEY=VALUE each.
	Env []string
	// Ready, when set, is the prefix of the line the child prints once it is ready: Start and
	// Restart wait for it.
	Ready string
	// ReadyTimeout bounds that wait (DefaultReadyTimeout when zero).
	ReadyTimeout time.Duration
	// Timeout is the child's -test.timeout (10 minutes when zero).
	Timeout time.Duration
}

// Proc is a child process. Its methods may be called from any goroutine, but Restart, Kill
// and the cleanup not concurrently with each other (one goroutine drives a child's life).
type Proc struct {
	t    testing.TB
	spec Spec

	mu     sync.Mutex
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string   // the current run's stdout lines; closed at its EOF
	exited chan struct{} // closed once the current run was waited for
	err    error         // the current run's exit, once exited
	ready  string
	runs   int
	// discard, closed by the test's cleanup, makes the stdout reader drop the lines nobody
	// will read: it must reach the process's exit however full lines is.
	discard     chan struct{}
	discardOnce sync.Once
}

// Start starts the child and, when spec.Ready is set, waits for its ready line. The child is
// killed at the test's end, whatever the test's outcome.
func Start(t testing.TB, spec Spec) *Proc {
	t.Helper()
	p := &Proc{t: t, spec: spec, discard: make(chan struct{})}
	t.Cleanup(p.cleanup)
	if err := p.start(); err != nil {
		t.Fatalf("proctest: %s: %v", spec.Name, err)
	}
	return p
}

// cleanup ends the child at the test's end, its unread lines dropped.
func (p *Proc) cleanup() {
	p.discardOnce.Do(func() { close(p.discard) })
	p.Kill()
}

// TryStart is Start returning the start's failure (no ready line in time, the child exited
// first) instead of failing the test; the child is killed then.
func TryStart(t testing.TB, spec Spec) (*Proc, error) {
	p := &Proc{t: t, spec: spec, discard: make(chan struct{})}
	t.Cleanup(p.cleanup)
	if err := p.start(); err != nil {
		return nil, fmt.Errorf("proctest: %s: %w", spec.Name, err)
	}
	return p, nil
}

// Restart starts a killed (or exited) child again with the same spec and waits for its
// ready line. It kills the child first if it still runs.
func (p *Proc) Restart() {
	p.t.Helper()
	p.Kill()
	if err := p.start(); err != nil {
		p.t.Fatalf("proctest: restart %s: %v", p.spec.Name, err)
	}
}

func (p *Proc) start() error {
	timeout := p.spec.Timeout
	if timeout == 0 {
		timeout = 10 * time.Minute
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+p.spec.Test+"$", "-test.count=1", "-test.v=false",
		"-test.timeout="+timeout.String())
	cmd.Env = append(os.Environ(), p.spec.Env...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = sysProcAttr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	lines, exited := make(chan string, linesMax), make(chan struct{})
	p.mu.Lock()
	p.cmd, p.stdin, p.lines, p.exited, p.err, p.ready = cmd, stdin, lines, exited, nil, ""
	p.runs++
	run := p.runs
	p.mu.Unlock()
	name, discard := p.spec.Name, p.discard
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			l := sc.Text()
			// The testing package's own lines (a child's failure, its PASS) go to the log.
			if l == "PASS" || l == "FAIL" || strings.HasPrefix(l, "--- ") || strings.HasPrefix(l, "=== ") ||
				strings.HasPrefix(l, "    ") {
				fmt.Fprintf(os.Stderr, "proctest: %s (run %d): %s\n", name, run, l)
				continue
			}
			select {
			case lines <- l:
			case <-discard:
			}
		}
		close(lines)
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(exited)
	}()
	if p.spec.Ready == "" {
		return nil
	}
	rt := p.spec.ReadyTimeout
	if rt == 0 {
		rt = DefaultReadyTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), rt)
	defer cancel()
	for {
		l, err := p.Next(ctx)
		if err != nil {
			p.Kill()
			return fmt.Errorf("no ready line %q: %w", p.spec.Ready, err)
		}
		if strings.HasPrefix(l, p.spec.Ready) {
			p.mu.Lock()
			p.ready = l
			p.mu.Unlock()
			return nil
		}
	}
}

// Ready returns the current run's ready line ("" when Spec.Ready is empty).
func (p *Proc) Ready() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ready
}

// Pid returns the current run's process id.
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// ErrExited is Next's error once the child exited and every line it printed was read.
var ErrExited = errors.New("proctest: the child exited")

// Next returns the current run's next stdout line, ErrExited once it exited and every line
// was read, or ctx's error.
func (p *Proc) Next(ctx context.Context) (string, error) {
	p.mu.Lock()
	lines := p.lines
	p.mu.Unlock()
	select {
	case l, ok := <-lines:
		if !ok {
			return "", fmt.Errorf("%w (%v)", ErrExited, p.exitErr())
		}
		return l, nil
	case <-ctx.Done():
		return "", fmt.Errorf("proctest: %s: no line: %w", p.spec.Name, ctx.Err())
	}
}

// Line is Next failing the test on an error. Only the test's goroutine.
func (p *Proc) Line(ctx context.Context) string {
	p.t.Helper()
	l, err := p.Next(ctx)
	if err != nil {
		p.t.Fatalf("proctest: %s: %v", p.spec.Name, err)
	}
	return l
}

// Lines returns the current run's stdout lines (closed once it exited and all were read).
// Read them from one place: Next and Line read the same channel.
func (p *Proc) Lines() <-chan string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lines
}

// Send writes line and a newline to the child's stdin.
func (p *Proc) Send(line string) error {
	p.mu.Lock()
	w := p.stdin
	p.mu.Unlock()
	_, err := io.WriteString(w, line+"\n")
	return err
}

// Ask sends line and returns the next stdout line (failing the test on an error). Only the
// test's goroutine.
func (p *Proc) Ask(ctx context.Context, line string) string {
	p.t.Helper()
	if err := p.Send(line); err != nil {
		p.t.Fatalf("proctest: %s: send %q: %v", p.spec.Name, line, err)
	}
	return p.Line(ctx)
}

// CloseInput closes the child's stdin: a child reading commands ends its loop (a graceful
// end; Wait for it).
func (p *Proc) CloseInput() error {
	p.mu.Lock()
	w := p.stdin
	p.mu.Unlock()
	return w.Close()
}

// Exited is closed once the current run exited.
func (p *Proc) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

func (p *Proc) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Wait waits for the current run to exit (its stdout lines not read yet are dropped) and
// returns its exit error, or ctx's.
func (p *Proc) Wait(ctx context.Context) error {
	p.mu.Lock()
	lines, exited := p.lines, p.exited
	p.mu.Unlock()
	go func() {
		for range lines {
		}
	}()
	select {
	case <-exited:
		return p.exitErr()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Signal sends sig to the current run.
func (p *Proc) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return errors.New("proctest: not started")
	}
	return p.cmd.Process.Signal(sig)
}

// Stop freezes the child (SIGSTOP): it runs no instruction until Cont; its sockets stay
// open, its timers do not fire. It returns once no thread of the child runs any more (on
// Linux; elsewhere once the signal is sent): the signal alone stops each thread only when
// it is next scheduled, so on a loaded machine the child could still answer a request sent
// after Stop returned. Waits at most stopWaitMax.
func (p *Proc) Stop() {
	p.t.Helper()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		p.t.Fatalf("proctest: stop %s: %v", p.spec.Name, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), stopWaitMax)
	defer cancel()
	if err := waitStopped(ctx, p.Pid()); err != nil && !errors.Is(err, errors.ErrUnsupported) {
		p.t.Fatalf("proctest: stop %s: %v", p.spec.Name, err)
	}
}

// stopWaitMax bounds Stop's wait for the child's threads to stop.
const stopWaitMax = 30 * time.Second

// Freeze stops the child (SIGSTOP) and returns, once no thread of it runs any more, every
// line it printed before that the test had not read yet: nothing it printed is in flight
// then (the pipe and the reader hold no line of it), so the lines Next returns after Cont
// were all printed after the resume. Stop cannot say that: a line printed just before the
// signal may still be in the pipe when Stop returns. Linux only (it reads /proc; elsewhere
// an error wrapping errors.ErrUnsupported, the child stopped). Only the test's goroutine,
// the child's lines read nowhere else meanwhile.
func (p *Proc) Freeze(ctx context.Context) ([]string, error) {
	marker, err := p.StopMarked(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for {
		l, err := p.Next(ctx)
		if err != nil {
			return out, fmt.Errorf("proctest: freeze %s: %w", p.spec.Name, err)
		}
		if l == marker {
			return out, nil
		}
		out = append(out, l)
	}
}

// StopMarked stops the child (SIGSTOP), waits until no thread of it runs any more, and puts a
// line of the parent's, the returned marker (unique), into its stdout after the last line it
// printed: in the child's lines (Next, Lines), every line before the marker was printed
// before StopMarked returned, every line after it after the child's Cont. Whoever reads the
// lines must expect the marker. Linux only (elsewhere an error wrapping
// errors.ErrUnsupported, the child stopped). Only the test's goroutine.
func (p *Proc) StopMarked(ctx context.Context) (string, error) {
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return "", fmt.Errorf("proctest: stop %s: %w", p.spec.Name, err)
	}
	pid := p.Pid()
	if err := waitStopped(ctx, pid); err != nil {
		return "", fmt.Errorf("proctest: stop %s: %w", p.spec.Name, err)
	}
	// Written into the child's stdout pipe: once the reader delivers it, it has delivered
	// every line before it.
	marker := fmt.Sprintf("%s%d %x", MarkerPrefix, pid, rand.Uint64())
	if err := writeStdout(pid, []byte(marker+"\n")); err != nil {
		return "", fmt.Errorf("proctest: stop %s: %w", p.spec.Name, err)
	}
	return marker, nil
}

// MarkerPrefix begins every StopMarked marker line.
const MarkerPrefix = "proctest-marker "

// Cont resumes a stopped child (SIGCONT).
func (p *Proc) Cont() {
	p.t.Helper()
	if err := p.Signal(syscall.SIGCONT); err != nil {
		p.t.Fatalf("proctest: cont %s: %v", p.spec.Name, err)
	}
}

// Kill kills the current run with SIGKILL (a crash: nothing flushed, no cleanup) and waits
// for it to exit; the lines it printed before stay readable (Next) until Restart.
// Idempotent; a child that exited already is only waited for.
func (p *Proc) Kill() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	// The stdout reader ends at EOF and waits for the process; a SIGKILLed process cannot
	// hold it for long, but a grandchild holding the pipe could: bound the wait.
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		fmt.Fprintf(os.Stderr, "proctest: %s: not exited 30 s after SIGKILL\n", p.spec.Name)
	}
}

// ChildInput returns the lines of the child's stdin (a helper test's commands), closed once
// the parent closed it or died. The helper's loop ends then.
func ChildInput() <-chan string {
	ch := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			ch <- sc.Text()
		}
		close(ch)
	}()
	return ch
}

// Printf prints one line (format's output, a newline added) to the child's stdout in one
// write: lines of several goroutines never interleave. Any goroutine.
func Printf(format string, args ...any) {
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

var outMu sync.Mutex
