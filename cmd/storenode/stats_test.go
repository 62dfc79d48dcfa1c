package main

import (
	"context"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
)

// The stats are defined once (storenode.StatDescs, server.StatDescs) and the wire's
// StatsReply and /metrics derive from that: every stat appears in both, under its WireName
// and its MetricName, with the same value, and neither has a stat of ours the tables do not
// define. The engine's stats are compared exactly (nothing moves them between the reads of
// an idle node); the server's counters move with the Stats requests themselves, so /metrics,
// scraped between two Stats requests, lies between their answers. Fails before the tables,
// when rows_per_sync, owners and requests_in_flight were missing from the wire and the wire
// named several stats otherwise (conns, bytes_in, writes...).
func TestStatsTied(t *testing.T) {
	node, err := server.New(server.Config{Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
		Options: storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone,
			CheckpointInterval: -1, CheckpointWALBytes: -1, Logger: slog.New(slog.DiscardHandler)}})
	require.NoError(t, err)
	require.NoError(t, node.Start())
	t.Cleanup(func() { _ = node.Shutdown(context.Background()) })
	m := startLoopbackMetrics(t, node, slog.New(slog.DiscardHandler))
	t.Cleanup(m.close)

	// Traffic that gives most stats a value: commits, a checkpoint, cached reads.
	c := dial(t, node.Addr().String(), nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	var ti sgio.TableInfo
	require.NoError(t, c.CallInto(ctx, &sgio.CreateTable{Name: "t", RowBytes: 64}, &ti))
	var g sgio.Grant
	require.NoError(t, c.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Owner: 1}, &g))
	var ids sgio.IDRange
	require.NoError(t, c.CallInto(ctx, &sgio.AllocIDs{Table: ti.Table, Owner: 1, Epoch: g.Epoch, Pages: 1}, &ids))
	rows := make([]byte, 3*64)
	for seq := uint64(1); seq <= 3; seq++ {
		commit := &sgio.Commit{Owner: 1, Seq: seq, Fences: []base.Fence{{Table: ti.Table, Epoch: g.Epoch}},
			Segments: []base.Segment{{Table: ti.Table, RowBytes: 64, Page: 0, Data: 0b111, Rows: rows}}}
		require.NoError(t, c.CallInto(ctx, commit, &sgio.CommitAck{}))
	}
	require.NoError(t, node.Engine().Checkpoint())
	var seg sgio.Segments
	require.NoError(t, c.CallInto(ctx, &sgio.ReadPages{Wants: []base.PageWant{{Table: ti.Table, Page: 0, Want: 0b11}}}, &seg))

	wire := func() map[string]uint64 {
		var rep sgio.StatsReply
		require.NoError(t, c.CallInto(ctx, &sgio.Stats{}, &rep))
		out := make(map[string]uint64, len(rep.Stats))
		for _, s := range rep.Stats {
			_, dup := out[s.Name]
			require.False(t, dup, "stat %s twice on the wire", s.Name)
			out[s.Name] = s.Value
		}
		return out
	}
	before := wire()
	code, text := httpGet(t, "http://"+m.addr.String()+"/metrics")
	require.Equal(t, http.StatusOK, code)
	metrics := parseMetrics(t, text)
	after := wire()

	types := make(map[string]string) // # TYPE lines: a counter is a counter in Prometheus too
	for _, m := range regexp.MustCompile(`(?m)^# TYPE (\S+) (\S+)$`).FindAllStringSubmatch(text, -1) {
		types[m[1]] = m[2]
	}
	kind := map[storenode.StatKind]string{storenode.StatCounter: "counter", storenode.StatGauge: "gauge"}
	for _, d := range storenode.StatDescs() {
		require.Equal(t, kind[d.Kind], types[metricPrefix+d.MetricName()], "type of %s", d.MetricName())
	}
	for _, d := range server.StatDescs() {
		require.Equal(t, kind[d.Kind], types[metricPrefix+d.MetricName()], "type of %s", d.MetricName())
	}

	engine, srv := storenode.StatDescs(), server.StatDescs()
	require.Len(t, before, len(engine)+len(srv), "the wire carries exactly the tables' stats")
	var hists []string // the latency histograms, beside the stats (latency.Histogram)
	for name, typ := range types {
		if typ == "histogram" {
			hists = append(hists, name)
		}
	}
	require.ElementsMatch(t, []string{"weft_commit_latency_seconds", "weft_wal_fsync_seconds", "weft_read_miss_seconds"}, hists)
	ours := 0
	for name := range metrics {
		if strings.HasPrefix(name, metricPrefix) && !slices.ContainsFunc(hists, func(h string) bool { return strings.HasPrefix(name, h+"_") }) {
			ours++
		}
	}
	require.Equal(t, len(engine)+len(srv), ours, "/metrics carries exactly the tables' stats and the histograms")
	require.Equal(t, float64(3), metrics["weft_commit_latency_seconds_count"], "the three commits")

	for _, d := range engine {
		v, ok := before[d.WireName()]
		require.True(t, ok, "engine stat %s on the wire", d.WireName())
		require.Equal(t, v, after[d.WireName()], "engine stat %s moved on an idle node", d.WireName())
		got, ok := metrics[metricPrefix+d.MetricName()]
		require.True(t, ok, "engine stat %s in /metrics", d.MetricName())
		require.Equal(t, d.MetricValue(v), got, "engine stat %s: wire %d, /metrics %v", d.Name, v, got)
	}
	for _, d := range srv {
		lo, ok := before[d.WireName()]
		require.True(t, ok, "server stat %s on the wire", d.WireName())
		hi := after[d.WireName()]
		got, ok := metrics[metricPrefix+d.MetricName()]
		require.True(t, ok, "server stat %s in /metrics", d.MetricName())
		if d.Name == "requests_in_flight" {
			// Each Stats request counts itself, and the one before it may not have ended yet
			// (a request ends once its reply's write is done, which may be after the client
			// read it); the scrape is no request.
			require.GreaterOrEqual(t, lo, uint64(1))
			require.GreaterOrEqual(t, hi, uint64(1))
			require.LessOrEqual(t, got, float64(1))
			continue
		}
		require.True(t, d.MetricValue(lo) <= got && got <= d.MetricValue(hi),
			"server stat %s: /metrics %v not between the wire's %d and %d", d.Name, got, lo, hi)
	}

	// The values are the traffic's: the tie is not between zeros.
	require.Equal(t, uint64(3), before["commits"])
	require.Equal(t, uint64(9), before["rows_written"])
	require.Equal(t, uint64(1), before["checkpoints"])
	require.NotZero(t, before["checkpoint_last_duration_ns"])
	require.NotZero(t, before["rows_per_sync_milli"])
	require.Equal(t, uint64(1), before["owners"])
	require.Equal(t, uint64(1), before["connections"])
}

// parseMetrics reads the unlabelled samples of a Prometheus text exposition.
func parseMetrics(t *testing.T, text string) map[string]float64 {
	t.Helper()
	out := make(map[string]float64)
	for _, m := range regexp.MustCompile(`(?m)^([a-zA-Z_:][a-zA-Z0-9_:]*) (\S+)$`).FindAllStringSubmatch(text, -1) {
		v, err := strconv.ParseFloat(m[2], 64)
		require.NoError(t, err, m[0])
		out[m[1]] = v
	}
	return out
}
