package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/weftdb/weft/cluster/etcdtest"
)

// shared is the etcd server most tests share, each under its own prefix; tests that stop
// etcd start their own. Started by the first test that needs it.
var (
	sharedOnce sync.Once
	shared     *etcdtest.Server
	sharedErr  error
	sharedDir  string
	prefixSeq  atomic.Int64
)

func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		shared.Close()
	}
	if sharedDir != "" {
		os.RemoveAll(sharedDir)
	}
	if code == 0 {
		// etcd's client and server leave no goroutine behind once closed.
		if err := goleak.Find(goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func sharedEtcd(t *testing.T) *etcdtest.Server {
	t.Helper()
	sharedOnce.Do(func() {
		sharedDir, sharedErr = os.MkdirTemp("", "weft-cluster-etcd-")
		if sharedErr == nil {
			shared, sharedErr = etcdtest.New(sharedDir)
		}
	})
	require.NoError(t, sharedErr)
	return shared
}

// testCtx is a test's bound: every wait in these tests ends by it.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// connect makes a client of endpoints under prefix, closed at the test's end.
func connect(t *testing.T, prefix string, endpoints ...string) *Client {
	t.Helper()
	// The session's warnings (keepalives failing while a test cuts etcd off) are expected.
	c, err := Connect(testCtx(t), Config{Endpoints: endpoints, Prefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// acquire takes partition p of table through s, failing the test on error.
func acquire(t *testing.T, ctx context.Context, s *Session, table string, p uint32) *Ownership {
	t.Helper()
	o, err := s.Acquire(ctx, table, p)
	require.NoError(t, err)
	return o
}

// newPrefix is a prefix no other test uses.
func newPrefix(t *testing.T) string {
	return fmt.Sprintf("/test/%s-%d/", t.Name(), prefixSeq.Add(1))
}

// sharedClient is a client of the shared etcd under a fresh prefix.
func sharedClient(t *testing.T) *Client {
	return connect(t, newPrefix(t), sharedEtcd(t).Endpoints()...)
}

// newProxy is an etcdtest.Proxy to target, closed at the test's end.
func newProxy(t *testing.T, target string) *etcdtest.Proxy {
	p, err := etcdtest.NewProxy(target)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// proxiedClients connects two clients of one fresh prefix to the shared etcd: c directly, ca
// through p, a proxy the test can cut.
func proxiedClients(t *testing.T) (c, ca *Client, p *etcdtest.Proxy) {
	t.Helper()
	srv := sharedEtcd(t)
	prefix := newPrefix(t)
	c = connect(t, prefix, srv.Endpoints()...)
	p = newProxy(t, srv.Addr())
	ca = connect(t, prefix, p.Endpoint())
	return c, ca, p
}

// fakeClock is a Clock that moves only by advance.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
