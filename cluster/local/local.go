// Package local runs a whole Weft cluster in one process on loopback, for a developer's
// machine, a demo or a test: a single-member etcd (go.etcd.io/etcd/server/v3/embed) and N
// storage nodes (storenode/server), each verifying the etcd grants of cluster-managed tables
// as cmd/storenode -etcd does (cluster.GrantVerifier, which is a storenode.TableMapVerifier
// too; the coordinators' leases read in etcd, Client as storenode.LeaseChecker; the
// two-phase commit's resolver reaching the other storage nodes with the peers' secret).
// `weft cluster up` (cmd/weft) and `crudbench --cluster` use it; docs/cluster.md, "Running a
// local cluster".
//
// Everything lives under Config.Dir:
//
//	cluster.json   the ports (etcd's client and peer ports, each storage node's), the
//	               number of storage nodes and the etcd prefix, chosen at the first start and
//	               kept: the partition map in etcd names the storage nodes by address and lives
//	               under the prefix, so a restart must reuse them
//	secret         the storage nodes' clients' secret (game servers': hex of 32 random
//	               bytes), mode 0600: the master, which proves any owner id; a game
//	               server of owner id N may be given its own owner's secret instead
//	               (`storenode -derive-owner-secret N -secret-file DIR/secret`), which
//	               proves N only
//	peer-secret    the storage nodes' peers' secret (each other's resolvers), mode 0600
//	operator-secret  the operators' secret (weft backup, partition moves), mode 0600
//	env            the settings a game server needs (Cluster.Env), for `. DIR/env` (values
//	               quoted for sh; paths absolute)
//	etcd/          etcd's data
//	store-0/ ...   each storage node's store
//
// A restart on the same Dir reuses all of it: the tables, the partition map, the secrets
// (docs/operations.md, "Roles and credentials"; a Dir from before roles gets the two new
// secret files at its next start). It
// is not a production deployment: one etcd member, every node in one process (one crash
// takes all of them), loopback only.
package local

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
)

// Defaults of Config.
const (
	DefaultStorageNodes = 3
	// EtcdReadyTimeout bounds how long Start waits for etcd's member to elect itself
	// (seconds on a loaded machine).
	EtcdReadyTimeout = time.Minute
	// StorageNodesMax bounds Config.StorageNodes.
	StorageNodesMax = 64
)

// Config is a local cluster's configuration.
type Config struct {
	// Dir holds everything (see the package doc); created when missing. Required. A
	// relative Dir is made absolute at Start (the paths in Env are).
	Dir string
	// StorageNodes is the number of storage nodes at the first start (DefaultStorageNodes
	// when zero). A restart takes the number from Dir (another nonzero value fails).
	StorageNodes int
	// EtcdPort is etcd's client port and BasePort the first storage node's (the others
	// follow it); etcd's peer port is EtcdPort+1. Zero: free ports picked at the first start.
	// Either way they are kept in Dir: a restart reuses them (another nonzero value fails).
	EtcdPort, BasePort int
	// Sync is the storage nodes' WAL sync mode (SyncAlways when zero).
	Sync storenode.SyncMode
	// CacheBytes is each storage node's disk page cache (storenode's default when zero).
	CacheBytes int64
	// Prefix is the cluster's key prefix in etcd ("/weft/" when empty) at the first start,
	// then kept in Dir: a restart takes it from there (another nonempty value fails).
	Prefix string
	// Logger receives the storage nodes' logs (slog.Default when nil). etcd's own log is
	// off but for its fatal errors (its stop logs errors of its closed listeners); etcd
	// failing or stopping shows in Failed.
	Logger *slog.Logger
}

// Cluster is a running local cluster.
type Cluster struct {
	// Etcd is etcd's client URL, Prefix the cluster's key prefix in etcd.
	Etcd, Prefix string
	// Nodes are the storage nodes' addresses (host:port), in order.
	Nodes []string
	// SecretFile holds the storage nodes' clients' secret (a game server's: node.Config.Secret);
	// Secret is its text.
	SecretFile string
	Secret     []byte
	// PeerSecretFile holds the storage nodes' peers' secret (their resolvers': nobody
	// else needs it); PeerSecret is its text.
	PeerSecretFile string
	PeerSecret     []byte
	// OperatorSecretFile holds the operators' secret (weft backup, node.Config.OperatorSecret
	// of a game server that moves partitions); OperatorSecret is its text.
	OperatorSecretFile string
	OperatorSecret     []byte
	// Dirs are the storage nodes' store directories, in order.
	Dirs []string

	etcd  *embed.Etcd
	cli   *cluster.Client
	srvs  []*server.Server
	peers []*server.Peer

	failed    chan struct{}
	failOnce  sync.Once
	closing   chan struct{}
	closeOnce sync.Once
	watchers  sync.WaitGroup
}

// layout is Dir/cluster.json.
type layout struct {
	EtcdClientPort int   `json:"etcd_client_port"`
	EtcdPeerPort   int   `json:"etcd_peer_port"`
	NodePorts      []int `json:"storage_node_ports"`
	// EtcdPrefix is the cluster's key prefix, recorded once etcd accepted it (empty in a
	// cluster.json of a start that did not get that far, or of an older version: the
	// next start records its own).
	EtcdPrefix string `json:"etcd_prefix,omitempty"`
}

// layoutBytesMax bounds cluster.json (a few hundred bytes at StorageNodesMax).
const layoutBytesMax = 64 << 10

const host = "127.0.0.1"

// Start starts the cluster (or restarts the one in cfg.Dir) and returns once etcd and every
// storage node serve. On an error nothing it started is left running. ctx bounds the start
// only.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Dir == "" {
		return nil, errors.New("local: Config.Dir is required")
	}
	if cfg.StorageNodes < 0 || cfg.StorageNodes > StorageNodesMax {
		return nil, fmt.Errorf("local: %d storage nodes (1..%d)", cfg.StorageNodes, StorageNodesMax)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Sync == 0 {
		cfg.Sync = storenode.SyncAlways
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("local: %w", err)
	}
	cfg.Dir = dir
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("local: %w", err)
	}
	lay, err := loadLayout(cfg)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Prefix: cmp.Or(cfg.Prefix, lay.EtcdPrefix, "/weft/"), failed: make(chan struct{}), closing: make(chan struct{})}
	for _, f := range []struct {
		name   string
		file   *string
		secret *[]byte
	}{{"secret", &c.SecretFile, &c.Secret}, {"peer-secret", &c.PeerSecretFile, &c.PeerSecret}, {"operator-secret", &c.OperatorSecretFile, &c.OperatorSecret}} {
		*f.file = filepath.Join(cfg.Dir, f.name)
		if *f.secret, err = loadSecret(*f.file); err != nil {
			return nil, err
		}
	}
	ok := false
	defer func() {
		if !ok {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			_ = c.Close(sctx)
		}
	}()
	if c.etcd, err = StartEtcd(filepath.Join(cfg.Dir, "etcd"), "weft-local", lay.EtcdClientPort, lay.EtcdPeerPort); err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("%w (is a cluster on %s running already? its ports are in cluster.json)", err, cfg.Dir)
		}
		return nil, err
	}
	c.Etcd = fmt.Sprintf("http://%s:%d", host, lay.EtcdClientPort)
	etcdFailed := make(chan struct{})
	c.watchers.Add(1)
	go func(e *embed.Etcd) {
		defer c.watchers.Done()
		select {
		case <-e.Err():
			close(etcdFailed)
		case <-e.Server.StopNotify():
			close(etcdFailed)
		case <-c.closing:
		}
	}(c.etcd)
	c.watch(etcdFailed)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	c.cli, err = cluster.Connect(cctx, cluster.Config{Endpoints: []string{c.Etcd}, Prefix: c.Prefix, Logger: cfg.Logger})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("local: etcd: %w", err)
	}
	if lay.EtcdPrefix != c.Prefix { // etcd took it: the cluster's from now on
		lay.EtcdPrefix = c.Prefix
		if err := writeLayout(cfg.Dir, lay); err != nil {
			return nil, err
		}
	}
	for i, port := range lay.NodePorts {
		dir := filepath.Join(cfg.Dir, fmt.Sprintf("store-%d", i))
		opts := storenode.Options{Dir: dir, Sync: cfg.Sync, CacheBytes: cfg.CacheBytes, Logger: cfg.Logger}
		c.peers = append(c.peers, WireEtcd(&opts, c.cli, server.PeerConfig{Secret: c.PeerSecret, Name: fmt.Sprintf("local-resolver-%d", i)}))
		srv, err := server.New(server.Config{
			Listen: net.JoinHostPort(host, fmt.Sprint(port)), Logger: cfg.Logger, Options: opts,
			Secret: c.Secret, PeerSecret: c.PeerSecret, OperatorSecret: c.OperatorSecret,
		})
		if err == nil {
			err = srv.Start()
		}
		if err != nil {
			return nil, fmt.Errorf("local: storage node %d (%s:%d, %s): %w", i, host, port, dir, err)
		}
		c.srvs = append(c.srvs, srv)
		c.watch(srv.Failed(), srv.Done())
		c.Nodes = append(c.Nodes, srv.Addr().String())
		c.Dirs = append(c.Dirs, dir)
	}
	if err := os.WriteFile(filepath.Join(cfg.Dir, "env"), []byte(c.EnvScript()), 0o600); err != nil {
		return nil, fmt.Errorf("local: %w", err)
	}
	ok = true
	return c, nil
}

// Env returns the settings a game server needs, as environment variables (KEY=value):
// WEFT_ETCD (cluster.Config.Endpoints), WEFT_ETCD_PREFIX (cluster.Config.Prefix),
// WEFT_STORAGE_NODES (comma-separated: node.Node.CreateTable's nodes), WEFT_SECRET_FILE
// (node.Config.Secret is its content) and WEFT_OPERATOR_SECRET_FILE (the operators':
// `weft backup` reads it; node.Config.OperatorSecret of a game server that moves
// partitions). The peers' secret is the storage nodes' alone: not in it.
func (c *Cluster) Env() []string {
	return []string{
		"WEFT_ETCD=" + c.Etcd,
		"WEFT_ETCD_PREFIX=" + c.Prefix,
		"WEFT_STORAGE_NODES=" + strings.Join(c.Nodes, ","),
		"WEFT_SECRET_FILE=" + c.SecretFile,
		"WEFT_OPERATOR_SECRET_FILE=" + c.OperatorSecretFile,
	}
}

// EnvScript returns Env as sh commands, one `export KEY=value` a line, each value quoted
// when it holds a character sh would read otherwise (Dir/env holds them).
func (c *Cluster) EnvScript() string {
	var b strings.Builder
	for _, kv := range c.Env() {
		k, v, _ := strings.Cut(kv, "=")
		b.WriteString("export " + k + "=" + shellQuote(v) + "\n")
	}
	return b.String()
}

// shellQuote returns v as one sh word: as it is when it holds only characters sh takes
// literally, else in single quotes.
func shellQuote(v string) string {
	if v != "" && strings.Trim(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/.,:_-+@%") == "" {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}

// Failed is closed when a part of the cluster stopped on its own (etcd failed or stopped, a
// storage node's transport stopped): the cluster no longer serves all it should; Close it.
func (c *Cluster) Failed() <-chan struct{} { return c.failed }

// watch closes c.failed when one of done is closed, until Close.
func (c *Cluster) watch(done ...<-chan struct{}) {
	for _, d := range done {
		c.watchers.Add(1)
		go func() {
			defer c.watchers.Done()
			select {
			case <-d:
				c.failOnce.Do(func() { close(c.failed) })
			case <-c.closing:
			}
		}()
	}
}

// Close stops the storage nodes (gracefully, within ctx: batches finished, checkpoint
// written), then etcd. It returns the first failure of a storage node's shutdown.
func (c *Cluster) Close(ctx context.Context) error {
	c.closeOnce.Do(func() { close(c.closing) })
	c.watchers.Wait()
	var errs []error
	for i, s := range c.srvs {
		if err := s.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("local: storage node %d: %w", i, err))
		}
	}
	c.srvs = nil
	for _, p := range c.peers {
		_ = p.Close()
	}
	c.peers = nil
	if c.cli != nil {
		_ = c.cli.Close()
		c.cli = nil
	}
	if c.etcd != nil {
		c.etcd.Close()
		c.etcd = nil
	}
	return errors.Join(errs...)
}

// loadLayout reads Dir/cluster.json, or picks the ports and writes it at the first start.
func loadLayout(cfg Config) (layout, error) {
	name := filepath.Join(cfg.Dir, "cluster.json")
	var lay layout
	b, err := readBounded(name, layoutBytesMax)
	switch {
	case err == nil:
		if lay, err = parseLayout(b); err != nil {
			return lay, fmt.Errorf("local: %s: %w: restore it, or start afresh in another directory", name, err)
		}
		switch {
		case cfg.StorageNodes != 0 && cfg.StorageNodes != len(lay.NodePorts):
			return lay, fmt.Errorf("local: %s has %d storage nodes, not %d: the partition map names them", cfg.Dir, len(lay.NodePorts), cfg.StorageNodes)
		case cfg.EtcdPort != 0 && cfg.EtcdPort != lay.EtcdClientPort, cfg.BasePort != 0 && cfg.BasePort != lay.NodePorts[0]:
			return lay, fmt.Errorf("local: %s runs on etcd port %d and storage node ports from %d (the partition map names them)", cfg.Dir, lay.EtcdClientPort, lay.NodePorts[0])
		case cfg.Prefix != "" && lay.EtcdPrefix != "" && cfg.Prefix != lay.EtcdPrefix:
			return lay, fmt.Errorf("local: %s runs under etcd prefix %q, not %q (its partition map is there)", cfg.Dir, lay.EtcdPrefix, cfg.Prefix)
		}
		return lay, nil
	case !errors.Is(err, os.ErrNotExist):
		return lay, fmt.Errorf("local: %w", err)
	}
	n := cfg.StorageNodes
	if n == 0 {
		n = DefaultStorageNodes
	}
	// Picked ports stay bound until all are picked: closed one by one, the kernel could
	// hand the same port out twice (a start refused as "repeated", CI of 0126799).
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	ports := func(first, count int) ([]int, error) {
		out := make([]int, count)
		for i := range out {
			if first != 0 {
				out[i] = first + i
				continue
			}
			l, err := freePort()
			if err != nil {
				return nil, err
			}
			held = append(held, l)
			out[i] = l.Addr().(*net.TCPAddr).Port
		}
		return out, nil
	}
	ep, err := ports(cfg.EtcdPort, 2)
	if err != nil {
		return lay, err
	}
	np, err := ports(cfg.BasePort, n)
	if err != nil {
		return lay, err
	}
	lay = layout{EtcdClientPort: ep[0], EtcdPeerPort: ep[1], NodePorts: np}
	if err := lay.check(); err != nil {
		// Refused before it is written: kept, it would refuse every later start in Dir.
		return lay, fmt.Errorf("local: etcd ports %d and %d, storage node ports %d..%d: %w", ep[0], ep[1], np[0], np[len(np)-1], err)
	}
	return lay, writeLayout(cfg.Dir, lay)
}

// writeLayout writes Dir/cluster.json whole (a temporary file renamed over it).
func writeLayout(dir string, lay layout) error {
	b, _ := json.MarshalIndent(lay, "", "  ")
	name := filepath.Join(dir, "cluster.json")
	if err := os.WriteFile(name+".tmp", append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("local: %w", err)
	}
	if err := os.Rename(name+".tmp", name); err != nil {
		return fmt.Errorf("local: %w", err)
	}
	return nil
}

// readBounded reads file name, refusing one over max bytes before reading it.
func readBounded(name string, max int64) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s: damaged: over %d bytes", name, max)
	}
	return b, nil
}

// parseLayout decodes cluster.json: every port in 1..65535 and distinct, 1..StorageNodesMax
// storage nodes.
func parseLayout(b []byte) (layout, error) {
	var lay layout
	if err := json.Unmarshal(b, &lay); err != nil {
		return layout{}, fmt.Errorf("damaged: %w", err)
	}
	if err := lay.check(); err != nil {
		return layout{}, fmt.Errorf("damaged: %w", err)
	}
	return lay, nil
}

// check reports whether a layout can be used: 1..StorageNodesMax storage nodes, every port
// in 1..65535 and distinct, the prefix (if any) ending with '/', at most 200 bytes.
func (lay layout) check() error {
	if n := len(lay.NodePorts); n == 0 || n > StorageNodesMax {
		return fmt.Errorf("%d storage nodes (1..%d)", n, StorageNodesMax)
	}
	if p := lay.EtcdPrefix; p != "" && (!strings.HasSuffix(p, "/") || len(p) > 200) {
		return fmt.Errorf("etcd prefix %q", p)
	}
	seen := make(map[int]bool, len(lay.NodePorts)+2)
	for _, p := range append([]int{lay.EtcdClientPort, lay.EtcdPeerPort}, lay.NodePorts...) {
		if p < 1 || p > 65535 || seen[p] {
			return fmt.Errorf("port %d out of range or repeated", p)
		}
		seen[p] = true
	}
	return nil
}

// freePort binds a free loopback port; the caller closes it before the cluster binds the
// port (another process may take it in between: the start then fails, and a second start
// in a fresh Dir picks others).
func freePort() (net.Listener, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, fmt.Errorf("local: pick a port: %w", err)
	}
	return l, nil
}

// loadSecret reads the secret file, or writes a new secret to it (mode 0600). A file that
// group or others may read or write is refused (on Unix), as cmd/storenode --secret-file does.
func loadSecret(name string) ([]byte, error) {
	fi, err := os.Stat(name)
	if errors.Is(err, os.ErrNotExist) {
		s := []byte(sgio.GenerateSecret())
		if err := os.WriteFile(name, append(s, '\n'), 0o600); err != nil {
			return nil, fmt.Errorf("local: %w", err)
		}
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("local: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 && runtime.GOOS != "windows" { // no Unix modes there
		return nil, fmt.Errorf("local: %s: mode %04o lets group or others read or write it; chmod 600 it", name, perm)
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("local: %w", err)
	}
	s := []byte(strings.TrimSpace(string(b)))
	if len(s) == 0 {
		return nil, fmt.Errorf("local: %s: empty, not a secret: restore it, or remove it for a new one (then restart every game server with it)", name)
	}
	if _, err := sgio.ParseSecret(s); err != nil {
		return nil, fmt.Errorf("local: %s: not a secret: %w", name, err)
	}
	return s, nil
}

// WireEtcd sets on opts what a storage node of the cluster needs of etcd, as cmd/storenode
// -etcd does: the grants of cluster-managed tables verified in etcd (cluster.GrantVerifier,
// also the storenode.TableMapVerifier of a holder's drop), the coordinators' leases read
// there (cli as storenode.LeaseChecker), and the two-phase commit's resolver reaching the
// other storage nodes as a peer (server.NewTxnPeer of peer: the peers' secret; only the
// partition map's storage nodes, cli as its Directory unless peer has one). The caller
// closes the returned Peer after the storage node stopped, and cli after that.
func WireEtcd(opts *storenode.Options, cli *cluster.Client, peer server.PeerConfig) *server.Peer {
	opts.GrantVerifier = cluster.NewGrantVerifier(cli, storenode.ErrFenced)
	opts.LeaseChecker = cli
	if peer.Directory == nil {
		peer.Directory = cli
	}
	p := server.NewTxnPeer(peer)
	opts.TxnPeer = p
	return p
}

// StartEtcd starts a single-member etcd named name, its data in dir (a restart on the same
// dir is the same member, with its data), serving clients on 127.0.0.1:clientPort and its
// peer URL on peerPort, its log off but for fatal errors, and waits (EtcdReadyTimeout) until
// it serves. The caller Closes it.
func StartEtcd(dir, name string, clientPort, peerPort int) (*embed.Etcd, error) {
	cu := url.URL{Scheme: "http", Host: net.JoinHostPort(host, fmt.Sprint(clientPort))}
	pu := url.URL{Scheme: "http", Host: net.JoinHostPort(host, fmt.Sprint(peerPort))}
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = dir
	cfg.LogLevel = "fatal"
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ClusterState = embed.ClusterStateFlagNew // ignored once dir holds a member
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("local: start etcd on %s: %w", cu.Host, err)
	}
	t := time.NewTimer(EtcdReadyTimeout)
	defer t.Stop()
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("local: etcd failed while starting: %w", err)
	case <-t.C:
		e.Close()
		return nil, fmt.Errorf("local: etcd did not become ready within %v", EtcdReadyTimeout)
	}
}
