package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/weftdb/weft/internal/latency"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
)

// The metrics endpoint: Prometheus /metrics, /healthz and pprof, on a mux of their own (never
// http.DefaultServeMux) and a listener of their own, loopback unless told otherwise. The
// Prometheus dependency stays in this binary: package storenode exposes plain counters
// (Engine.Stats, Server.Stats), read at each scrape.

// metricsServer is the running HTTP server of --metrics-listen.
type metricsServer struct {
	srv  *http.Server
	addr net.Addr
	done chan struct{}
}

// Bounds of the metrics server's handlers: a profile or trace runs at most
// profileSecondsMax, and every response must be written within metricsWriteTimeout.
const (
	profileSecondsMax   = 30
	metricsWriteTimeout = (profileSecondsMax + 15) * time.Second
)

// Bounds of the metrics server's connections (issue 22, defect 9: 1300 idle connections to
// an unbounded listener took the descriptors a checkpoint needed). At most metricsConnsMax
// are held at once: one past it is accepted and closed at once. Each is counted in the
// storage node's descriptor budget (server.Config.ReservedFiles, metricsFiles); a request's
// header and body must arrive within metricsReadTimeout, and a keep-alive connection idle
// for metricsIdleTimeout is closed.
const (
	metricsConnsMax    = 32
	metricsReadTimeout = 5 * time.Second
	metricsIdleTimeout = 15 * time.Second
)

// metricsFiles is the descriptors the metrics server may hold for --metrics-listen addr: its
// listener and metricsConnsMax connections, none when it is off.
func metricsFiles(addr string) int {
	if addr == "" {
		return 0
	}
	return metricsConnsMax + 1
}

// listenMetrics binds the metrics address, holding at most metricsConnsMax connections at
// once (connCap). run calls it before it starts the storage node, so an address in use fails
// the start before the store's directory is touched.
func listenMetrics(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return &connCap{Listener: ln, slots: make(chan struct{}, metricsConnsMax)}, nil
}

// connCap is a listener that holds at most cap(slots) connections: one accepted past them is
// closed at once (the client sees the connection end before any reply), and Accept waits for
// the next. A connection's slot is freed by its first Close.
type connCap struct {
	net.Listener
	slots   chan struct{}
	refused atomic.Uint64
}

// Accept returns the next connection that finds a free slot.
func (l *connCap) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &cappedConn{Conn: c, l: l}, nil
		default:
			l.refused.Add(1)
			_ = c.Close()
		}
	}
}

// cappedConn is a connection of connCap holding a slot until closed.
type cappedConn struct {
	net.Conn
	l    *connCap
	once sync.Once
}

// Close closes the connection and frees its slot.
func (c *cappedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { <-c.l.slots })
	return err
}

// startMetrics serves /metrics, /healthz and (on loopback, or with pprofPublic) /debug/pprof/
// of node on ln, which it takes over.
func startMetrics(ln net.Listener, pprofPublic bool, node *server.Server, logger *slog.Logger) *metricsServer {
	addr := ln.Addr().String()
	host, _, _ := net.SplitHostPort(addr)
	withPprof := server.IsLoopback(host) || pprofPublic
	switch {
	case !server.IsLoopback(host) && pprofPublic:
		logger.Warn("storenode: metrics and pprof served on a non-loopback address (--pprof-non-loopback)", "addr", addr)
	case !server.IsLoopback(host):
		logger.Warn("storenode: metrics served on a non-loopback address; pprof off (--pprof-non-loopback turns it on)", "addr", addr)
	}
	m := &metricsServer{
		srv: &http.Server{Handler: metricsMux(node, withPprof), ReadHeaderTimeout: metricsReadTimeout,
			ReadTimeout: metricsReadTimeout, WriteTimeout: metricsWriteTimeout, IdleTimeout: metricsIdleTimeout,
			MaxHeaderBytes: 16 << 10},
		addr: ln.Addr(),
		done: make(chan struct{}),
	}
	go func() {
		defer close(m.done)
		if err := m.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("storenode: metrics server", "err", err)
		}
	}()
	logger.Info("storenode: metrics listening", "addr", m.addr.String())
	return m
}

func (m *metricsServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = m.srv.Shutdown(ctx)
	<-m.done
}

// metricsMux routes /metrics, /healthz and, withPprof, /debug/pprof/ (profile and trace
// bounded to profileSecondsMax).
func metricsMux(node *server.Server, withPprof bool) *http.ServeMux {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newNodeCollector(node),
	)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := node.Healthy(); err != nil {
			http.Error(w, node.PublicText(err), http.StatusServiceUnavailable) // no data paths
			return
		}
		fmt.Fprintln(w, "ok")
	})
	if !withPprof {
		return mux
	}
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", boundedSeconds(pprof.Profile))
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", boundedSeconds(pprof.Trace))
	return mux
}

// boundedSeconds refuses a ?seconds= beyond profileSecondsMax (or not a number).
func boundedSeconds(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if v := r.FormValue("seconds"); v != "" {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil || n < 0 || n > profileSecondsMax {
				http.Error(w, fmt.Sprintf("seconds=%q: want 0..%d", v, profileSecondsMax), http.StatusBadRequest)
				return
			}
		}
		h(w, r)
	}
}

// metric is one exported series: its description, its kind and how to read it.
type metric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(e *storenode.Stats, s *server.Stats) float64
}

// metricPrefix starts every metric's name.
const metricPrefix = "weft_"

// nodeCollector reads the engine's and the server's counters at each scrape. Its metrics are
// the stat tables' (storenode.StatDescs, server.StatDescs): the names, help texts, kinds and
// values the wire's StatsReply carries too, named and scaled by Prometheus's conventions
// (StatDesc.MetricName, MetricValue).
type nodeCollector struct {
	node    *server.Server
	metrics []metric
}

func newNodeCollector(node *server.Server) *nodeCollector {
	c := &nodeCollector{node: node}
	for _, d := range storenode.StatDescs() {
		c.metrics = append(c.metrics, metric{metricDesc(d.MetricName(), d.Help), metricKind(d.Kind),
			func(e *storenode.Stats, _ *server.Stats) float64 { return d.MetricValue(d.Value(e)) }})
	}
	for _, d := range server.StatDescs() {
		c.metrics = append(c.metrics, metric{metricDesc(d.MetricName(), d.Help), metricKind(d.Kind),
			func(_ *storenode.Stats, s *server.Stats) float64 { return d.MetricValue(d.Value(s)) }})
	}
	return c
}

func metricDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(metricPrefix+name, help, nil, nil)
}

func metricKind(k storenode.StatKind) prometheus.ValueType {
	if k == storenode.StatCounter {
		return prometheus.CounterValue
	}
	return prometheus.GaugeValue
}

// Describe sends every metric's description.
func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.metrics {
		ch <- m.desc
	}
	ch <- histCommit
	ch <- histWALSync
	ch <- histReadMiss
}

// Collect reads the counters once and sends every metric, then the latency histograms.
func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	e := c.node.Engine()
	if e == nil {
		return
	}
	es, ss := e.Stats(), c.node.Stats()
	for _, m := range c.metrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(&es, &ss))
	}
	lat := e.Latencies()
	commit := c.node.CommitLatency()
	for _, h := range []struct {
		desc *prometheus.Desc
		s    *latency.Snapshot
	}{{histCommit, &commit}, {histWALSync, &lat.WALSync}, {histReadMiss, &lat.ReadMiss}} {
		ch <- histogramMetric(h.desc, h.s)
	}
}

// The latency histograms (internal/latency: power-of-two microsecond buckets).
var (
	histCommit = prometheus.NewDesc(metricPrefix+"commit_latency_seconds",
		"Time of each acknowledged Commit, from its arrival to its acknowledgement (group commit and WAL sync included).", nil, nil)
	histWALSync = prometheus.NewDesc(metricPrefix+"wal_fsync_seconds",
		"Time of each fdatasync of the WAL.", nil, nil)
	histReadMiss = prometheus.NewDesc(metricPrefix+"read_miss_seconds",
		"Time of each page read from a data file (a disk page cache miss).", nil, nil)
)

// histogramMetric is s as a Prometheus histogram: cumulative counts under each finite bound,
// the sum in seconds.
func histogramMetric(desc *prometheus.Desc, s *latency.Snapshot) prometheus.Metric {
	buckets := make(map[float64]uint64, latency.Buckets-1)
	var cum uint64
	for i := range latency.Buckets - 1 {
		cum += s.Counts[i]
		buckets[latency.Bound(i).Seconds()] = cum
	}
	return prometheus.MustNewConstHistogram(desc, s.Count(), s.Sum.Seconds(), buckets)
}
