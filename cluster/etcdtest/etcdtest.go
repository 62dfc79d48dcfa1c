// Package etcdtest runs a real, in-process, single-member etcd server (go.etcd.io/etcd/server/v3
// embed) for tests: on 127.0.0.1 ports chosen at random, with its data directory under the
// test's t.TempDir(), stopped by the test's cleanup. Stop and Start restart it on the same
// ports and data, so a test can take etcd away from running clients and give it back.
//
// Only tests import this package: it links etcd's server (raft, bbolt, grpc), which no game
// server binary should. .ci/run checks that no package a game server links depends on it.
package etcdtest

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// startTimeout bounds how long a start waits for the server to be ready (a loaded 2-core
// machine can take seconds to elect a single member).
const startTimeout = 60 * time.Second

// Server is one embedded etcd. Start, New and Restart: one goroutine at a time.
type Server struct {
	dir       string
	clientURL url.URL
	peerURL   url.URL
	// front is the proxy clients dial: Stop cuts it first, so etcd's Close has no client
	// stream to drain (it would wait seconds for them).
	front *Proxy
	mu    sync.Mutex
	e     *embed.Etcd
}

// Start starts an etcd server for t, its data under t.TempDir(), and registers its stop with
// t.Cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := New(t.TempDir())
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// New starts an etcd server with its data in dir (for a TestMain's server shared by a
// package's tests); the caller stops it.
func New(dir string) (*Server, error) {
	s := &Server{dir: dir}
	var err error
	for try := 0; try < 5; try++ {
		// The ports are picked by listening on :0 and closing: another process may take
		// one before etcd binds it, hence the retries.
		var cp, pp int
		if cp, err = freePort(); err != nil {
			continue
		}
		if pp, err = freePort(); err != nil {
			continue
		}
		s.clientURL = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cp)}
		s.peerURL = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pp)}
		if err = s.start(); err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	if s.front, err = NewProxy(s.clientURL.Host); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// Endpoints returns the client URLs to dial (clientv3.Config.Endpoints).
func (s *Server) Endpoints() []string { return []string{s.front.Endpoint()} }

// Addr returns the client address, host:port (a proxy in front of the server: the same
// across restarts).
func (s *Server) Addr() string { return s.front.Addr() }

// ServerEndpoints returns the server's own client URLs, not behind the proxy: a test's
// observer that must keep reaching etcd while Cut takes it away from everyone else. They
// change with no restart; Stop stops them too.
func (s *Server) ServerEndpoints() []string { return []string{s.clientURL.String()} }

// Cut takes the network between etcd and every client of Endpoints away (true: their
// connections closed, new ones closed at once) or gives it back (false), with etcd running:
// unlike Stop, the server goes on expiring the leases nobody can renew. Any goroutine.
func (s *Server) Cut(cut bool) { s.front.Cut(cut) }

func (s *Server) start() error {
	cfg := embed.NewConfig()
	cfg.Name = "weft-test"
	cfg.Dir = s.dir
	// etcd logs every stop's closed listeners as errors; a start that fails returns its
	// error anyway. WEFT_ETCD_LOG=info (or debug, warn, error) shows its log on stderr.
	cfg.LogLevel = "fatal"
	if lv := os.Getenv("WEFT_ETCD_LOG"); lv != "" {
		cfg.LogLevel = lv
	}
	cfg.ListenClientUrls = []url.URL{s.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{s.clientURL}
	cfg.ListenPeerUrls = []url.URL{s.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{s.peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ClusterState = embed.ClusterStateFlagNew
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("etcdtest: server failed while starting: %w", err)
	case <-time.After(startTimeout):
		e.Close()
		return errors.New("etcdtest: server not ready in time")
	}
	s.mu.Lock()
	s.e = e
	s.mu.Unlock()
	return nil
}

// Stop stops the server (idempotent) at once, like a crash: no lease expires while it
// stops. Clients see connection errors until Restart.
// Any goroutine.
func (s *Server) Stop() {
	s.mu.Lock()
	e := s.e
	s.e = nil
	s.mu.Unlock()
	if s.front != nil {
		s.front.Cut(true)
	}
	if e != nil {
		// Raft and the lessor first: Close drains client streams for seconds, during
		// which a running server would go on expiring the leases its clients can no
		// longer renew. A crash stops them at once too.
		e.Server.HardStop()
		e.Close()
	}
}

// Close stops the server and its proxy (idempotent).
func (s *Server) Close() {
	s.Stop()
	if s.front != nil {
		s.front.Close()
	}
}

// Restart starts a stopped server again on the same ports and data directory: every key,
// lease and revision it had survives (etcd renews every lease to its full TTL when it
// starts, as on a new leader). It fails only if the ports cannot be bound again.
func (s *Server) Restart() error {
	s.Stop()
	var err error
	for try := 0; try < 20; try++ {
		if err = s.start(); err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
		time.Sleep(50 * time.Millisecond) // not synchronisation: waiting out the kernel's hold on a port
	}
	if err != nil {
		return fmt.Errorf("etcdtest: restart: %w", err)
	}
	s.front.Cut(false)
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
