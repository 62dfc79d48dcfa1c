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
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/weftdb/weft/storenode"
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

// listenMetrics binds the metrics address. run calls it before it starts the storage node, so
// an address in use fails the start before the store's directory is touched.
func listenMetrics(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return ln, nil
}

// startMetrics serves /metrics, /healthz and (on loopback, or with pprofPublic) /debug/pprof/
// of node on ln, which it takes over.
func startMetrics(ln net.Listener, pprofPublic bool, node *storenode.Server, logger *slog.Logger) *metricsServer {
	addr := ln.Addr().String()
	host, _, _ := net.SplitHostPort(addr)
	withPprof := storenode.IsLoopback(host) || pprofPublic
	switch {
	case !storenode.IsLoopback(host) && pprofPublic:
		logger.Warn("storenode: metrics and pprof served on a non-loopback address (--pprof-non-loopback)", "addr", addr)
	case !storenode.IsLoopback(host):
		logger.Warn("storenode: metrics served on a non-loopback address; pprof off (--pprof-non-loopback turns it on)", "addr", addr)
	}
	m := &metricsServer{
		srv: &http.Server{Handler: metricsMux(node, withPprof), ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout: 10 * time.Second, WriteTimeout: metricsWriteTimeout, IdleTimeout: time.Minute,
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
func metricsMux(node *storenode.Server, withPprof bool) *http.ServeMux {
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
	value func(e *storenode.Stats, s *storenode.ServerStats) float64
}

// nodeCollector reads the engine's and the server's counters at each scrape.
type nodeCollector struct {
	node    *storenode.Server
	metrics []metric
}

func newNodeCollector(node *storenode.Server) *nodeCollector {
	c := &nodeCollector{node: node}
	add := func(name, help string, kind prometheus.ValueType, value func(e *storenode.Stats, s *storenode.ServerStats) float64) {
		c.metrics = append(c.metrics, metric{prometheus.NewDesc("weft_"+name, help, nil, nil), kind, value})
	}
	counter, gauge := prometheus.CounterValue, prometheus.GaugeValue
	f := func(v uint64) float64 { return float64(v) }

	// Commits and the WAL.
	add("commits_total", "Commit batches applied.", counter, func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return f(e.Commits) })
	add("retried_batches_total", "Commit batches acknowledged again without being applied (same owner and seq).", counter,
		func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return f(e.RetriedBatches) })
	add("rows_written_total", "Rows written or deleted by commits.", counter, func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return f(e.RowsWritten) })
	add("wal_bytes_total", "Bytes appended to the WAL.", counter, func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return f(e.WALBytes) })
	add("wal_records_total", "Records appended to the WAL.", counter, func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return f(e.WALRecords) })
	add("wal_syncs_total", "fdatasync calls on the WAL (each covers a group of commits).", counter,
		func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return f(e.WALSyncs) })
	add("rows_per_sync", "Rows written per WAL sync since start: the group commit factor.", gauge,
		func(e *storenode.Stats, _ *storenode.ServerStats) float64 {
			if e.WALSyncs == 0 {
				return 0
			}
			return float64(e.RowsWritten) / float64(e.WALSyncs)
		})
	add("last_lsn", "Last LSN handed to the WAL.", gauge, func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return f(e.LastLSN) })
	add("commit_stall_longest_seconds", "Longest time a commit waited for the disk page cache to make room.", gauge,
		func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return e.LongestStall.Seconds() })

	// The disk page cache and the data files.
	add("cache_hits_total", "Page reads served from the disk page cache.", counter, func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return f(e.CacheHits) })
	add("cache_misses_total", "Page reads that needed the data file.", counter, func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return f(e.CacheMisses) })
	add("cache_pages", "Pages in the disk page cache.", gauge, func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return float64(e.CachePages) })
	add("dirty_pages", "Pages in the disk page cache changed since the last checkpoint.", gauge,
		func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return float64(e.DirtyPages) })
	add("cache_bytes", "Bytes of the disk page cache in use (frames and metadata).", gauge,
		func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return float64(e.CacheBytes) })
	add("disk_reads_total", "Disk pages read from data files.", counter, func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return f(e.DiskReads) })
	add("disk_writes_total", "Disk pages written to data files by checkpoints.", counter, func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return f(e.DiskWrites) })

	// Checkpoints.
	add("checkpoints_total", "Checkpoints published.", counter, func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return f(e.Checkpoints) })
	add("checkpoint_pages_total", "Pages written by checkpoints.", counter, func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return f(e.CheckpointPages) })
	add("checkpoint_last_duration_seconds", "Duration of the last checkpoint.", gauge,
		func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return e.LastCheckpoint.Seconds() })
	add("checkpoint_lsn", "LSN of the last published checkpoint; the WAL is replayed from it at start.", gauge,
		func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return f(e.CheckpointLSN) })

	// Backups.
	add("backups", "Backups holding a snapshot now: meanwhile the WAL from its checkpoint on and the disk pages it maps are kept.", gauge,
		func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return float64(e.Backups) })
	add("backup_held_pages", "Disk pages checkpoints replaced but keep from reuse for running backups.", gauge,
		func(e *storenode.Stats, _ *storenode.ServerStats) float64 { return float64(e.BackupHeldPages) })

	// Connections and requests.
	add("connections", "Connections open now.", gauge, func(_ *storenode.Stats, s *storenode.ServerStats) float64 { return f(s.Conns) })
	add("connections_accepted_total", "Connections accepted.", counter, func(_ *storenode.Stats, s *storenode.ServerStats) float64 { return f(s.ConnsAccepted) })
	add("connections_rejected_total", "Connections refused: over --max-conns, or during shutdown.", counter,
		func(_ *storenode.Stats, s *storenode.ServerStats) float64 { return f(s.ConnsRejected) })
	add("auth_failures_total", "Handshakes failed: wrong secret, or requests before authentication.", counter,
		func(_ *storenode.Stats, s *storenode.ServerStats) float64 { return f(s.AuthFailures) })
	add("auth_timeouts_total", "Connections closed for not authenticating within --auth-timeout.", counter,
		func(_ *storenode.Stats, s *storenode.ServerStats) float64 { return f(s.AuthTimeouts) })
	add("idle_closes_total", "Sessions closed after --idle-timeout without traffic.", counter,
		func(_ *storenode.Stats, s *storenode.ServerStats) float64 { return f(s.IdleCloses) })
	add("rejected_frames_total", "Frames that broke the protocol (bad magic, checksum, length, type or body).", counter,
		func(_ *storenode.Stats, s *storenode.ServerStats) float64 { return f(s.RejectedFrames) })
	add("busy_replies_total", "Requests refused with ErrBusy: over --max-inflight on their connection.", counter,
		func(_ *storenode.Stats, s *storenode.ServerStats) float64 { return f(s.BusyReplies) })
	add("requests_total", "Requests received after authentication.", counter, func(_ *storenode.Stats, s *storenode.ServerStats) float64 { return f(s.Requests) })
	add("requests_in_flight", "Requests received and not yet answered.", gauge,
		func(_ *storenode.Stats, s *storenode.ServerStats) float64 { return float64(s.InFlight) })
	add("reply_writes_total", "Writes (writev calls) carrying replies; requests_total / reply_writes_total is the batching factor.", counter,
		func(_ *storenode.Stats, s *storenode.ServerStats) float64 { return f(s.Writes) })
	add("received_bytes_total", "Frame bytes received.", counter, func(_ *storenode.Stats, s *storenode.ServerStats) float64 { return f(s.BytesIn) })
	add("sent_bytes_total", "Frame bytes sent.", counter, func(_ *storenode.Stats, s *storenode.ServerStats) float64 { return f(s.BytesOut) })
	add("connections_handshaking", "Connections in the handshake now (bounded by --max-handshakes).", gauge,
		func(_ *storenode.Stats, s *storenode.ServerStats) float64 { return f(s.Handshaking) })
	add("sessions_authenticated", "Authenticated sessions now.", gauge, func(_ *storenode.Stats, s *storenode.ServerStats) float64 { return f(s.Authenticated) })
	add("handshake_evictions_total", "Handshaking connections closed to make room for newer ones.", counter,
		func(_ *storenode.Stats, s *storenode.ServerStats) float64 { return f(s.Evictions) })
	add("accept_errors_total", "Failed accepts (EMFILE...), each retried after a back-off.", counter,
		func(_ *storenode.Stats, s *storenode.ServerStats) float64 { return f(s.AcceptErrors) })
	add("commit_queued_bytes", "Commit bytes queued on all connections (bounded by --max-queued-bytes-total).", gauge,
		func(_ *storenode.Stats, s *storenode.ServerStats) float64 { return float64(s.QueuedBytes) })
	return c
}

// Describe sends every metric's description.
func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.metrics {
		ch <- m.desc
	}
}

// Collect reads the counters once and sends every metric.
func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	e := c.node.Engine()
	if e == nil {
		return
	}
	es, ss := e.Stats(), c.node.Stats()
	for _, m := range c.metrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(&es, &ss))
	}
}
