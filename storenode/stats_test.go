package storenode

import (
	"math"
	"reflect"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/sgio"
)

// checkStatDescs checks a stat table against its snapshot type T: every field of T is read by
// some descriptor (a field added to T without a stat fails here), names are valid on the wire
// and in Prometheus and unique, and every descriptor has a help text and a kind.
func checkStatDescs[T any](t *testing.T, descs []StatDesc[T]) {
	t.Helper()
	metricName := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	seen := make(map[string]bool)
	for _, d := range descs {
		require.NoError(t, sgio.CheckName(d.WireName()), d.Name)
		require.Regexp(t, metricName, d.MetricName())
		require.NotEmpty(t, d.Help, d.Name)
		require.Contains(t, []StatKind{StatCounter, StatGauge}, d.Kind, d.Name)
		require.False(t, seen[d.Name], "stat %s twice", d.Name)
		seen[d.Name] = true
	}
	values := func(s *T) []uint64 {
		out := make([]uint64, len(descs))
		for i, d := range descs {
			out[i] = d.Value(s)
		}
		return out
	}
	var zero T
	base := values(&zero)
	typ := reflect.TypeFor[T]()
	for i := range typ.NumField() {
		var s T
		f := reflect.ValueOf(&s).Elem().Field(i)
		switch f.Kind() {
		case reflect.Uint64:
			f.SetUint(7777)
		case reflect.Int, reflect.Int64:
			f.SetInt(7777)
		default:
			t.Fatalf("field %s of %s: kind %v has no stat encoding", typ.Field(i).Name, typ.Name(), f.Kind())
		}
		require.NotEqual(t, base, values(&s), "field %s of %s is read by no stat", typ.Field(i).Name, typ.Name())
	}
}

func TestStatDescsCoverStats(t *testing.T) {
	checkStatDescs(t, StatDescs())
}

// The units' names and scales, and the ratio's edges.
func TestStatUnits(t *testing.T) {
	d := StatDesc[Stats]{Name: "x", Kind: StatCounter, Unit: UnitNanos}
	require.Equal(t, "x_ns", d.WireName())
	require.Equal(t, "x_seconds_total", d.MetricName())
	require.Equal(t, 1.5, d.MetricValue(1_500_000_000))
	d = StatDesc[Stats]{Name: "r", Kind: StatGauge, Unit: UnitMilli}
	require.Equal(t, "r_milli", d.WireName())
	require.Equal(t, "r", d.MetricName())
	require.Equal(t, 2.5, d.MetricValue(2500))

	require.Zero(t, (&Stats{RowsWritten: 5}).rowsPerSyncMilli(), "no sync yet")
	require.Equal(t, uint64(2500), (&Stats{RowsWritten: 5, WALSyncs: 2}).rowsPerSyncMilli())
	require.Equal(t, uint64(1000), (&Stats{RowsWritten: math.MaxUint64 / 3, WALSyncs: math.MaxUint64 / 3}).rowsPerSyncMilli(), "no overflow")
	require.Equal(t, uint64(math.MaxUint64), (&Stats{RowsWritten: math.MaxUint64, WALSyncs: 1}).rowsPerSyncMilli(), "saturates")
}

// rows_written and commits count what was committed since Open: the WAL replayed at Open is
// not counted (fails on a31a3ef: after a kill -9, rows_written showed every replayed row
// beside commits 0).
func TestStatsCountCommitsSinceOpenNotReplay(t *testing.T) {
	fs := vfs.NewFaultFS()
	opts := Options{Dir: "db", FS: fs, Logger: quietLogger, CheckpointInterval: -1}
	e := openEngine(t, opts)
	info, g := ownedTable(t, e, "items", 64, testOwner, 1)
	fences := []base.Fence{{Table: info.ID, Epoch: g.Epoch}}
	for seq := uint64(1); seq <= 10; seq++ {
		commitWait(t, e, &base.Batch{Owner: testOwner, Seq: seq, Fences: fences,
			Segments: []base.Segment{oneRow(info.ID, seq, row64(seq))}})
	}
	s := e.Stats()
	require.Equal(t, uint64(10), s.Commits)
	require.Equal(t, uint64(10), s.RowsWritten)
	fs.CrashKeepAll() // kill -9: the next Open replays the ten commits
	_ = e.Close()

	e = openEngine(t, opts)
	defer e.Close()
	row, ok := readRow(t, e, info.ID, 10)
	require.True(t, ok, "replayed")
	require.Equal(t, row64(10), row)
	s = e.Stats()
	require.Zero(t, s.Commits)
	require.Zero(t, s.RowsWritten, "replay is not counted as rows written")
}
