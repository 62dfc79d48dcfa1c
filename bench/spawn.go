package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// --spawn-store runs the storage node in a second process with no separate build step: the
// program re-executes its own binary (os.Executable, which is the test binary under go test)
// with storeChildEnv set. The child's main (cmd/crudbench, bench/peers, or a TestMain) calls
// IsStoreChild first and, when it is set, StoreChildMain instead of its usual work. The child
// serves on a free loopback port, prints "listening <addr>" as its first stdout line, and
// exits 0 after SIGTERM (or SIGINT, or when its stdin closes because the parent is gone).

// storeChildEnv carries the child's configuration, as JSON.
const storeChildEnv = "WEFT_CRUDBENCH_STORENODE"

// storeChildReadyTimeout bounds how long the parent waits for the child's address.
const storeChildReadyTimeout = 30 * time.Second

// storeChildConfig is the spawned storage node's configuration.
type storeChildConfig struct {
	Sync       string `json:"sync"`
	CacheBytes int64  `json:"cache_bytes"`
	TempDir    string `json:"temp_dir,omitempty"`
	// Etcd is the cluster's etcd endpoint (--cluster): the node then verifies the grants of
	// cluster-managed tables there, as cmd/storenode -etcd does.
	Etcd string `json:"etcd,omitempty"`
	// SecretFile, PeerSecretFile and OperatorSecretFile hold the roles' secrets (--cluster:
	// clients', peers', operators'; files of mode 0600 the parent wrote): none for
	// --spawn-store, a loopback node without secrets.
	SecretFile         string `json:"secret_file,omitempty"`
	PeerSecretFile     string `json:"peer_secret_file,omitempty"`
	OperatorSecretFile string `json:"operator_secret_file,omitempty"`
}

// IsStoreChild reports whether this process was started by --spawn-store to be the storage
// node; its main must then return StoreChildMain's exit code and do nothing else.
func IsStoreChild() bool { return os.Getenv(storeChildEnv) != "" }

// StoreChildMain runs the storage node of --spawn-store in a fresh temporary directory,
// removed when it stops, and returns the process exit code.
func StoreChildMain() int {
	var cfg storeChildConfig
	if err := json.Unmarshal([]byte(os.Getenv(storeChildEnv)), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "crudbench storenode: bad %s: %v\n", storeChildEnv, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		io.Copy(io.Discard, os.Stdin) // EOF: the parent closed the pipe or died
		stop()
	}()
	dir, err := os.MkdirTemp(cfg.TempDir, "crudbench-store-*")
	if err != nil {
		fmt.Fprintf(os.Stderr, "crudbench storenode: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	err = serveStore(ctx, dir, cfg, func(addr string) {
		fmt.Fprintf(os.Stdout, "listening %s\n", addr)
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "crudbench storenode: %v\n", err)
		return 1
	}
	return 0
}

// spawnedStore is a storage node child process.
type spawnedStore struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	addr  string
	exit  chan error // the child's Wait result, once
}

// spawnStore starts the child and waits for its address.
func spawnStore(ctx context.Context, cfg storeChildConfig, stderr io.Writer) (*spawnedStore, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bench: spawn store: %w", err)
	}
	env, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), storeChildEnv+"="+string(env))
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: spawn store: %w", err)
	}
	s := &spawnedStore{cmd: cmd, stdin: stdin, exit: make(chan error, 1)}
	lines := make(chan string, 1)
	go func() {
		br := bufio.NewReader(stdout)
		line, _ := br.ReadString('\n')
		lines <- line
		io.Copy(io.Discard, br) // keep the pipe drained until the child exits
		s.exit <- cmd.Wait()
	}()
	ready := time.NewTimer(storeChildReadyTimeout)
	defer ready.Stop()
	select {
	case line := <-lines:
		addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
		if ok && addr != "" {
			s.addr = addr
			return s, nil
		}
		s.kill()
		return nil, fmt.Errorf("bench: spawn store: the child said %q, not its address", line)
	case <-ready.C:
		s.kill()
		return nil, fmt.Errorf("bench: spawn store: no address within %v", storeChildReadyTimeout)
	case <-ctx.Done():
		s.kill()
		return nil, ctx.Err()
	}
}

func (s *spawnedStore) kill() {
	s.cmd.Process.Kill()
	s.stdin.Close()
}

// storeChildStopTimeout bounds a clean shutdown (the child checkpoints and closes its engine).
const storeChildStopTimeout = 2 * time.Minute

// stop sends SIGTERM and waits for the child; it fails unless the child exited 0.
func (s *spawnedStore) stop() error {
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("bench: stop store: %w", err)
	}
	t := time.NewTimer(storeChildStopTimeout)
	defer t.Stop()
	select {
	case err := <-s.exit:
		s.stdin.Close()
		if err != nil {
			return fmt.Errorf("bench: the spawned storage node did not exit cleanly: %w", err)
		}
		return nil
	case <-t.C:
		s.kill()
		return fmt.Errorf("bench: the spawned storage node did not stop within %v of SIGTERM", storeChildStopTimeout)
	}
}
