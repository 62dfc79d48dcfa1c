package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
)

// runEnv is what run takes from the process: tests pass their own.
type runEnv struct {
	args   []string
	getenv func(string) string
	stdout io.Writer
	stderr io.Writer
	// ready, when set, is called once the storage node (and the metrics server, nil when
	// off) listen: tests learn port-0 addresses from it.
	ready func(server, metrics net.Addr)
}

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // the storage node failed while running, or at shutdown
	exitUsage   = 2 // bad flags or configuration; nothing was started
)

// config is the parsed command line (flags, then WEFT_* environment variables for the flags
// not given).
type config struct {
	listen          string
	dir             string
	cache           byteSize
	sync            string
	checkpointEvery time.Duration
	checkpointWAL   byteSize
	lease           time.Duration
	secretFile      string
	advertise       string
	peerSecretFile  string
	opSecretFile    string
	maxConns        int
	maxInflight     int
	maxBody         byteSize
	authTimeout     time.Duration
	idleTimeout     time.Duration
	shutdownTimeout time.Duration
	metricsListen   string
	tlsCert         string
	tlsKey          string
	tlsPeerCA       string
	logLevel        string
	logFormat       string
	version         bool
	genSecret       bool
	deriveOwner     string // --derive-owner-secret's owner id; empty when not given
	seqGapWait      time.Duration
	maxHandshakes   int
	maxHsPerSource  int
	authFailDelay   time.Duration
	maxQueued       byteSize
	maxQueuedTotal  byteSize
	maxOutTotal     byteSize
	pprofPublic     bool
	etcd            string
	etcdPrefix      string
	peers           string
	// peerConfig is the resolver's, as serverConfig made it: run adds etcd's list of
	// storage nodes (-etcd) to it.
	peerConfig server.PeerConfig
}

// envPrefix prefixes every flag's environment variable: --max-conns is WEFT_MAX_CONNS.
const envPrefix = "WEFT_"

// envName is the environment variable of a flag.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func newFlagSet(cfg *config, output io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("storenode", flag.ContinueOnError)
	fs.SetOutput(output)
	cfg.cache = storenode.DefaultCacheBytes
	cfg.checkpointWAL = storenode.DefaultCheckpointWALBytes
	cfg.maxBody = server.DefaultMaxBody
	fs.StringVar(&cfg.listen, "listen", server.DefaultListen, "TCP address to serve on, host:port (a non-loopback address needs --secret-file)")
	fs.StringVar(&cfg.advertise, "advertise", "", "with --etcd: the address the cluster's partition map names this node by, host:port (default: --listen; needed when that is 0.0.0.0 or [::])")
	fs.StringVar(&cfg.dir, "dir", "", "store directory, created if missing (required)")
	fs.Var(&cfg.cache, "cache", "disk page cache size, e.g. 512MiB, 4GiB")
	fs.StringVar(&cfg.sync, "sync", "always", "WAL sync mode: always (fdatasync before each ack; survives power loss) or none (survives kill -9 only)")
	fs.DurationVar(&cfg.checkpointEvery, "checkpoint-every", storenode.DefaultCheckpointInterval, "checkpoint this long after the last one when anything is dirty (0: never by time)")
	fs.Var(&cfg.checkpointWAL, "checkpoint-wal", "checkpoint when the WAL has grown this much since the last one (0: never by size)")
	fs.DurationVar(&cfg.lease, "lease", storenode.DefaultLeaseDuration, "ownership lease: how long a transaction node keeps a table without traffic")
	fs.StringVar(&cfg.secretFile, "secret-file", "", "file holding the clients' (game servers') secret (must not be readable by group or others)")
	fs.StringVar(&cfg.peerSecretFile, "peer-secret-file", "", "file holding the secret of the cluster's storage nodes: their resolvers' requests, and this node's resolver's to them (mode 0600)")
	fs.StringVar(&cfg.opSecretFile, "operator-secret-file", "", "file holding the operators' secret: backups, partition moves, drops of other owners' tables (mode 0600)")
	fs.IntVar(&cfg.maxConns, "max-conns", server.DefaultMaxConns, "most connections held at once")
	fs.IntVar(&cfg.maxInflight, "max-inflight", server.DefaultMaxInflight, "most requests in flight per connection")
	fs.Var(&cfg.maxBody, "max-body", "largest request frame body (at most 64MiB)")
	fs.DurationVar(&cfg.authTimeout, "auth-timeout", server.DefaultAuthTimeout, "time from connecting to a completed handshake")
	fs.DurationVar(&cfg.idleTimeout, "idle-timeout", server.DefaultIdleTimeout, "close sessions idle this long (0: never)")
	fs.DurationVar(&cfg.shutdownTimeout, "shutdown-timeout", server.DefaultShutdownTimeout, "bound of the graceful shutdown on SIGINT/SIGTERM")
	fs.StringVar(&cfg.metricsListen, "metrics-listen", "", "serve /metrics, /healthz and /debug/pprof/ on this address (host defaults to 127.0.0.1; off when empty)")
	fs.StringVar(&cfg.tlsCert, "tls-cert", "", "TLS certificate file (PEM); with --tls-key, serve over TLS")
	fs.StringVar(&cfg.tlsKey, "tls-key", "", "TLS private key file (PEM)")
	fs.StringVar(&cfg.tlsPeerCA, "tls-peer-ca", "", "CA certificates (PEM) the resolver verifies other storage nodes' TLS certificates against (default: the system's roots)")
	fs.StringVar(&cfg.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&cfg.logFormat, "log-format", "text", "log format: text or json")
	fs.BoolVar(&cfg.version, "version", false, "print the version and exit")
	fs.BoolVar(&cfg.genSecret, "gen-secret", false, "print a new secret (hex of 32 random bytes) for --secret-file and exit")
	fs.StringVar(&cfg.deriveOwner, "derive-owner-secret", "", "print the secret of this owner id (a game server's), derived from --secret-file's, and exit: it proves that owner id only")
	cfg.maxQueued = server.DefaultMaxQueuedBytes
	cfg.maxQueuedTotal = server.DefaultMaxQueuedBytesTotal
	cfg.maxOutTotal = server.DefaultMaxOutboundBytesTotal
	fs.DurationVar(&cfg.seqGapWait, "seq-gap-wait", storenode.DefaultSeqGapWait, "how long a commit batch waits for the batches before it in its owner's seq order")
	fs.IntVar(&cfg.maxHandshakes, "max-handshakes", server.DefaultMaxHandshakes, "most connections in the handshake at once (at most half of --max-conns); over it the oldest is closed")
	fs.IntVar(&cfg.maxHsPerSource, "max-handshakes-per-source", server.DefaultMaxHandshakesPerSource, "most connections in the handshake from one source address")
	fs.DurationVar(&cfg.authFailDelay, "auth-fail-delay", server.DefaultAuthFailDelay, "delay before a wrong proof is answered and its connection closed")
	fs.Var(&cfg.maxQueued, "max-queued-bytes", "most request bytes (commits, waiting reads) queued on one connection")
	fs.Var(&cfg.maxQueuedTotal, "max-queued-bytes-total", "most request bytes (commits, waiting reads) queued on all connections")
	fs.StringVar(&cfg.etcd, "etcd", "", "etcd client URLs, comma-separated (http://127.0.0.1:2379): verify the etcd grants of cluster-managed tables (off when empty: such grants are refused)")
	fs.StringVar(&cfg.etcdPrefix, "etcd-prefix", "", "the cluster's key prefix in etcd (/weft/ when empty)")
	fs.StringVar(&cfg.peers, "peers", "", "the other storage nodes' host:port, comma-separated, as coordinators name them: the two-phase commit's resolver dials only these and, with --etcd, the partition map's nodes (none: it dials no primary)")
	fs.Var(&cfg.maxOutTotal, "max-outbound-bytes-total", "most reply bytes waiting for their clients on all connections; over it, connections with replies waiting are not read until they drain")
	fs.BoolVar(&cfg.pprofPublic, "pprof-non-loopback", false, "serve /debug/pprof/ even when --metrics-listen is not a loopback address (it shows the command line)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: storenode -dir DIR [flags]\n\nRuns a Weft storage node. Every flag can also be set by an environment variable,\nWEFT_ and the flag's name in capitals with _ for - (WEFT_MAX_CONNS); a flag on the\ncommand line wins.\n\n")
		fs.PrintDefaults()
	}
	return fs
}

// parseConfig parses the command line, then fills each flag not given from its environment
// variable.
func parseConfig(args []string, getenv func(string) string, output io.Writer) (*config, error) {
	cfg := &config{}
	fs := newFlagSet(cfg, output)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil || f.Name == "version" || f.Name == "gen-secret" || f.Name == "derive-owner-secret" {
			return
		}
		if v := getenv(envName(f.Name)); v != "" {
			if serr := fs.Set(f.Name, v); serr != nil {
				err = fmt.Errorf("%s=%q: %w", envName(f.Name), v, serr)
			}
		}
	})
	return cfg, err
}

// serverConfig turns the command line into the storage node's configuration.
func (cfg *config) serverConfig(logger *slog.Logger) (server.Config, error) {
	var sc server.Config
	if cfg.dir == "" {
		return sc, errors.New("--dir (or WEFT_DIR) is required")
	}
	mode, ok := storenode.ParseSyncMode(cfg.sync)
	if !ok {
		return sc, fmt.Errorf("--sync %q: want always or none", cfg.sync)
	}
	if cfg.maxBody > byteSize(64<<20) {
		return sc, fmt.Errorf("--max-body %v: at most 64MiB", cfg.maxBody)
	}
	sc = server.Config{
		Listen:          cfg.listen,
		Advertise:       cfg.advertise,
		MaxConns:        cfg.maxConns,
		MaxInflight:     cfg.maxInflight,
		MaxBody:         uint32(cfg.maxBody),
		AuthTimeout:     cfg.authTimeout,
		IdleTimeout:     cfg.idleTimeout,
		ShutdownTimeout: cfg.shutdownTimeout,
		Logger:          logger,

		MaxHandshakes:          cfg.maxHandshakes,
		MaxHandshakesPerSource: cfg.maxHsPerSource,
		AuthFailDelay:          cfg.authFailDelay,
		MaxQueuedBytes:         int64(cfg.maxQueued),
		MaxQueuedBytesTotal:    int64(cfg.maxQueuedTotal),
		MaxOutboundBytesTotal:  int64(cfg.maxOutTotal),
		ReservedFiles:          metricsFiles(cfg.metricsListen),
		Options: storenode.Options{
			Dir:                cfg.dir,
			Sync:               mode,
			CacheBytes:         int64(cfg.cache),
			CheckpointInterval: cfg.checkpointEvery,
			CheckpointWALBytes: int64(cfg.checkpointWAL),
			LeaseDuration:      cfg.lease,
			SeqGapWait:         cfg.seqGapWait,
			Logger:             logger,
		},
	}
	// Zero means "never" on the command line, but "the default" in Options.
	if cfg.checkpointEvery == 0 {
		sc.Options.CheckpointInterval = -1
	}
	if cfg.checkpointWAL == 0 {
		sc.Options.CheckpointWALBytes = -1
	}
	if cfg.idleTimeout == 0 {
		sc.IdleTimeout = -1
	}
	// The roles' secrets (docs/operations.md, "Roles and credentials"): without any, every
	// caller has every role (loopback only); with the clients' alone, no storage node's
	// resolver and no operator is accepted.
	for _, f := range []struct {
		flag, name string
		dst        *[]byte
	}{
		{"secret-file", cfg.secretFile, &sc.Secret},
		{"peer-secret-file", cfg.peerSecretFile, &sc.PeerSecret},
		{"operator-secret-file", cfg.opSecretFile, &sc.OperatorSecret},
	} {
		if f.name == "" {
			continue
		}
		secret, err := readSecretFile(f.flag, f.name)
		if err != nil {
			return sc, err
		}
		*f.dst = secret
	}
	if cfg.secretFile != "" && cfg.peerSecretFile == "" {
		logger.Warn("storenode: no --peer-secret-file: other storage nodes' resolvers are refused, so two-phase commits in doubt here and at them are not resolved")
	}
	if cfg.secretFile != "" && cfg.opSecretFile == "" {
		logger.Warn("storenode: no --operator-secret-file: backups, partition moves and operators' drops are refused")
	}
	switch {
	case cfg.tlsCert != "" && cfg.tlsKey != "":
		cert, err := tls.LoadX509KeyPair(cfg.tlsCert, cfg.tlsKey)
		if err != nil {
			return sc, fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		sc.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	case cfg.tlsCert != "" || cfg.tlsKey != "":
		return sc, errors.New("--tls-cert and --tls-key go together")
	}
	// The two-phase commit's resolver reaches other storage nodes (the primaries of the
	// transactions prepared here) as a peer, with the peers' secret (the clients' when none
	// is configured: accepted only by a node without secrets); over TLS when this
	// node serves TLS, verifying the peers against --tls-peer-ca (a cluster's private CA),
	// else the system's roots. Without a CA that signed the peers' certificates the resolver
	// cannot reach a primary, and transactions in doubt stay locked.
	pc := server.PeerConfig{Secret: sc.PeerSecret, Name: "storenode-resolver"}
	if len(pc.Secret) == 0 {
		pc.Secret = sc.Secret
	}
	switch {
	case sc.TLS != nil:
		pc.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
		if cfg.tlsPeerCA != "" {
			pem, err := os.ReadFile(cfg.tlsPeerCA)
			if err != nil {
				return sc, fmt.Errorf("--tls-peer-ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return sc, fmt.Errorf("--tls-peer-ca: %s holds no PEM certificate", cfg.tlsPeerCA)
			}
			pc.TLS.RootCAs = pool
		}
	case cfg.tlsPeerCA != "":
		return sc, errors.New("--tls-peer-ca needs --tls-cert and --tls-key (peers speak TLS only when this node serves it)")
	}
	// It dials only the storage nodes of the cluster: --peers, and with --etcd the partition
	// map's (run adds them); a primary a client names is never dialed with the peers' secret
	// (docs/cluster.md, "Peers").
	for _, a := range strings.Split(cfg.peers, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			return sc, fmt.Errorf("--peers: %q is not host:port", a)
		}
		pc.Peers = append(pc.Peers, a)
	}
	cfg.peerConfig = pc
	sc.Options.TxnPeer = server.NewTxnPeer(pc)
	return sc, nil
}

// readSecretFile reads the secret file name of flag flag (secret-file, peer-secret-file,
// operator-secret-file), refusing a file that group or others may read or write: a secret
// anyone on the machine can read protects nothing. Surrounding white space (the newline an
// editor adds) is not part of the secret.
func readSecretFile(flag, name string) ([]byte, error) {
	fi, err := os.Stat(name)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("--%s %s: mode %04o lets group or others read or write it; chmod 600 it", flag, name, perm)
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, fmt.Errorf("--%s %s: empty", flag, name)
	}
	if _, err := sgio.ParseSecret(b); err != nil {
		return nil, fmt.Errorf("--%s %s: %w (storenode -gen-secret makes one)", flag, name, err)
	}
	return b, nil
}

// deriveOwnerSecret reports the secret of --derive-owner-secret's owner id, derived from
// --secret-file's clients' secret (sgio.DeriveOwnerSecret).
func deriveOwnerSecret(cfg *config) (string, error) {
	owner, err := strconv.ParseUint(cfg.deriveOwner, 10, 64)
	if err != nil || owner == 0 {
		return "", fmt.Errorf("--derive-owner-secret %q: want an owner id, a positive decimal integer", cfg.deriveOwner)
	}
	if cfg.secretFile == "" {
		return "", errors.New("--derive-owner-secret needs --secret-file, the clients' secret it derives from")
	}
	clients, err := readSecretFile("secret-file", cfg.secretFile)
	if err != nil {
		return "", err
	}
	return sgio.DeriveOwnerSecret(clients, owner)
}

// newLogger builds the process's slog logger.
func newLogger(cfg *config, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", cfg.logLevel, err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch cfg.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", cfg.logFormat)
}

// version describes the build, from the module's build info.
func version() string {
	v := "(devel)"
	var rev, when string
	dirty := false
	goVersion := runtime.Version()
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		goVersion = bi.GoVersion
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	out := "storenode " + v
	if rev != "" {
		out += " " + rev
		if dirty {
			out += "-dirty"
		}
		if when != "" {
			out += " " + when
		}
	}
	return out + " " + goVersion + " " + runtime.GOOS + "/" + runtime.GOARCH
}

// run is the whole program but for the signals: it serves until ctx ends, then shuts down
// gracefully, and returns the exit code.
func run(ctx context.Context, env runEnv) int {
	cfg, err := parseConfig(env.args, env.getenv, env.stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(env.stderr, "storenode:", err)
		return exitUsage
	}
	if cfg.version {
		fmt.Fprintln(env.stdout, version())
		return exitOK
	}
	if cfg.genSecret {
		fmt.Fprintln(env.stdout, sgio.GenerateSecret())
		return exitOK
	}
	if cfg.deriveOwner != "" {
		secret, err := deriveOwnerSecret(cfg)
		if err != nil {
			fmt.Fprintln(env.stderr, "storenode:", err)
			return exitUsage
		}
		fmt.Fprintln(env.stdout, secret)
		return exitOK
	}
	logger, err := newLogger(cfg, env.stderr)
	if err != nil {
		fmt.Fprintln(env.stderr, "storenode:", err)
		return exitUsage
	}
	sc, err := cfg.serverConfig(logger)
	if err == nil {
		cfg.metricsListen, err = metricsAddr(cfg.metricsListen)
	}
	if err != nil {
		logger.Error("storenode: bad configuration", "err", err)
		return exitUsage
	}
	if cfg.etcd != "" {
		// Connected before the store opens: the first open of a restored copy holding
		// cluster tables reads etcd's revision.
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cli, err := cluster.Connect(cctx, cluster.Config{Endpoints: strings.Split(cfg.etcd, ","), Prefix: cfg.etcdPrefix, Logger: logger})
		cancel()
		if err != nil {
			logger.Error("storenode: etcd", "err", err)
			return exitFailure
		}
		defer cli.Close()
		sc.Options.GrantVerifier = cluster.NewGrantVerifier(cli, storenode.ErrFenced)
		// A primary records abort for a resolver only once the coordinator's etcd lease is
		// gone (Client.LeaseAlive, etcd's TimeToLive).
		sc.Options.LeaseChecker = cli
		// The resolver dials the storage nodes of the partition map too (cluster.Client's
		// StorageNodes, read again every few seconds).
		if p, ok := sc.Options.TxnPeer.(*server.Peer); ok {
			_ = p.Close() // unused: it never dialed
			pc := cfg.peerConfig
			pc.Directory = cli
			sc.Options.TxnPeer = server.NewTxnPeer(pc)
		}
	}
	srv, err := server.New(sc)
	if err != nil {
		logger.Error("storenode: bad configuration", "err", err)
		return exitUsage
	}
	// Everything that can fail before the store is touched is done first (the metrics
	// address here, the listen address and the file limit in Start), so a start that fails
	// on them leaves the store's directory as it was.
	var metricsLn net.Listener
	if cfg.metricsListen != "" {
		if metricsLn, err = listenMetrics(cfg.metricsListen); err != nil {
			logger.Error("storenode: metrics", "err", err)
			return exitFailure
		}
	}
	logger.Info("storenode: starting", "version", version(), "dir", cfg.dir, "sync", cfg.sync, "cache", cfg.cache.String())
	if err := srv.Start(); err != nil {
		if metricsLn != nil {
			_ = metricsLn.Close()
		}
		logger.Error("storenode: start", "err", err)
		return exitFailure
	}
	var metrics *metricsServer
	if metricsLn != nil {
		metrics = startMetrics(metricsLn, cfg.pprofPublic, srv, logger)
	}
	if env.ready != nil {
		var maddr net.Addr
		if metrics != nil {
			maddr = metrics.addr
		}
		env.ready(srv.Addr(), maddr)
	}
	failed := false
	select {
	case <-ctx.Done():
		logger.Info("storenode: signal received, shutting down")
	case <-srv.Done():
	case <-srv.Failed():
		// The network transport stopped on its own: no longer serving. Exit with a failure
		// (after a shutdown that makes what was committed durable), so a supervisor restarts
		// the node rather than keep a process that serves nobody.
		logger.Error("storenode: no longer serving; exiting", "err", srv.Healthy())
		failed = true
	}
	code := shutdown(srv, cfg.shutdownTimeout, logger)
	if p, ok := sc.Options.TxnPeer.(*server.Peer); ok {
		_ = p.Close()
	}
	if failed {
		code = exitFailure
	}
	if metrics != nil {
		metrics.close()
	}
	return code
}

// shutdown stops the server within timeout and returns the exit code.
func shutdown(srv *server.Server, timeout time.Duration, logger *slog.Logger) int {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		logger.Error("storenode: shutdown", "err", err)
		return exitFailure
	}
	return exitOK
}

// metricsAddr completes a --metrics-listen address: a missing host means loopback.
func metricsAddr(addr string) (string, error) {
	if addr == "" {
		return "", nil
	}
	if _, err := strconv.Atoi(addr); err == nil {
		addr = ":" + addr // a bare port
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("--metrics-listen %q: %w", addr, err)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// byteSize is a flag of a byte count with an optional binary unit: 65536, 64KiB, 512MiB, 4GiB
// (K, M, G, T and KB, MB... mean the same powers of 1024).
type byteSize int64

func (b *byteSize) String() string {
	n := int64(*b)
	for _, u := range []struct {
		suffix string
		shift  uint
	}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}} {
		if n != 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

func (b *byteSize) Set(s string) error {
	t := strings.TrimSpace(s)
	num := strings.TrimRightFunc(t, func(r rune) bool { return r < '0' || r > '9' })
	unit := strings.ToUpper(strings.TrimSpace(t[len(num):]))
	shift := map[string]uint{"": 0, "B": 0, "K": 10, "KB": 10, "KIB": 10, "M": 20, "MB": 20, "MIB": 20,
		"G": 30, "GB": 30, "GIB": 30, "T": 40, "TB": 40, "TIB": 40}
	sh, ok := shift[unit]
	n, err := strconv.ParseInt(num, 10, 64)
	if !ok || err != nil || n < 0 || (sh > 0 && n > (1<<63-1)>>sh) {
		return fmt.Errorf("size %q: want a number of bytes with an optional unit (KiB, MiB, GiB, TiB)", s)
	}
	*b = byteSize(n << sh)
	return nil
}
