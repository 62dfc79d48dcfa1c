package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Config is how Connect reaches etcd.
type Config struct {
	// Endpoints are etcd's client URLs (http://127.0.0.1:2379, ...). Required.
	Endpoints []string
	// Prefix is the key prefix of this cluster's state ("/weft/" when empty). It must end
	// with '/' and have no segment "map", "own" or "move" (those would fall inside the keys of a
	// cluster under a shorter prefix). Several clusters (or tests) may share one etcd under
	// different prefixes.
	Prefix string
	// DialTimeout bounds the first connection (5 s when zero).
	DialTimeout time.Duration
	// TLS, when set, is used for the connection to etcd.
	TLS *tls.Config
	// Username and Password authenticate to etcd when set.
	Username, Password string
	// Logger receives the package's warnings (slog.Default when nil).
	Logger *slog.Logger
}

// Client is a connection to the cluster's etcd, under one prefix. Its methods may be called
// from any goroutine.
type Client struct {
	cli   *clientv3.Client
	own   bool // Close closes cli
	keys  keys
	log   *slog.Logger
	clock Clock
}

// Connect dials etcd. It fails with ErrUnavailable if no endpoint answers within
// DialTimeout or ctx.
func Connect(ctx context.Context, cfg Config) (*Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, fmt.Errorf("%w: no etcd endpoints", ErrInvalid)
	}
	prefix, err := checkPrefix(cfg.Prefix)
	if err != nil {
		return nil, err
	}
	dial := cfg.DialTimeout
	if dial <= 0 {
		dial = 5 * time.Second
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   cfg.Endpoints,
		DialTimeout: dial,
		TLS:         cfg.TLS,
		Username:    cfg.Username,
		Password:    cfg.Password,
		Context:     context.WithoutCancel(ctx),
		// The client's own logging stays quiet: failures come back as errors.
		Logger: zap.NewNop(),
		// Keepalive pings detect a dead connection within seconds, not at the kernel's
		// TCP timeout. Not more often: etcd's server closes a connection that pings more
		// often than its --grpc-keepalive-min-time (5 s by default).
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
	})
	if err != nil {
		return nil, unavailable("connect", err)
	}
	// clientv3.New does not wait for a connection: prove one with a linearizable read.
	cctx, cancel := context.WithTimeout(ctx, dial)
	defer cancel()
	if _, err := cli.Get(cctx, prefix+"map/", clientv3.WithCountOnly()); err != nil {
		cli.Close()
		return nil, unavailable("connect", err)
	}
	return newClient(cli, true, prefix, cfg.Logger), nil
}

// NewClient wraps an existing etcd client (which the caller keeps and closes) under prefix.
func NewClient(cli *clientv3.Client, prefix string, log *slog.Logger) (*Client, error) {
	p, err := checkPrefix(prefix)
	if err != nil {
		return nil, err
	}
	return newClient(cli, false, p, log), nil
}

func newClient(cli *clientv3.Client, own bool, prefix string, log *slog.Logger) *Client {
	if log == nil {
		log = slog.Default()
	}
	return &Client{cli: cli, own: own, keys: keys{prefix: prefix}, log: log, clock: systemClock{}}
}

func checkPrefix(p string) (string, error) {
	if p == "" {
		return "/weft/", nil
	}
	if !strings.HasSuffix(p, "/") || len(p) > 200 {
		return "", fmt.Errorf("%w: prefix %q must end with '/' (at most 200 bytes)", ErrInvalid, p)
	}
	// A prefix inside another cluster's key space (<other>map/... or <other>own/...) would
	// be that cluster's tables and owner keys: its DropTable would delete this one's keys.
	for _, seg := range strings.Split(p, "/") {
		if seg == "map" || seg == "own" || seg == "move" {
			return "", fmt.Errorf("%w: prefix %q has a segment %q (the key space of a cluster under a shorter prefix)", ErrInvalid, p, seg)
		}
	}
	return p, nil
}

// Etcd returns the underlying etcd client (for tools and tests). Do not write under the
// prefix with it: the package's invariants hold only for its own writes.
func (c *Client) Etcd() *clientv3.Client { return c.cli }

// Close closes the connection if Connect made it. Sessions of c must be closed first.
func (c *Client) Close() error {
	if !c.own {
		return nil
	}
	return c.cli.Close()
}

// Clock is the clock of ownership deadlines. Now must be monotonic (time.Now's readings carry
// a monotonic reading, so a step of the wall clock moves no deadline). Tests inject a fake
// one. Any goroutine may call it.
type Clock interface{ Now() time.Time }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }
