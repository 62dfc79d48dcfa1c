package server

import (
	"reflect"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// Every field of Stats is read by some stat, names are valid and unique, and none is also an
// engine stat's (the wire's StatsReply carries both tables). cmd/storenode's TestStatsTied
// ties the tables to the wire and to /metrics.
func TestStatDescsCoverStats(t *testing.T) {
	metricName := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	seen := make(map[string]bool)
	for _, d := range storenode.StatDescs() {
		seen[d.WireName()] = true
	}
	for _, d := range StatDescs() {
		require.NoError(t, sgio.CheckName(d.WireName()), d.Name)
		require.Regexp(t, metricName, d.MetricName())
		require.NotEmpty(t, d.Help, d.Name)
		require.Contains(t, []storenode.StatKind{storenode.StatCounter, storenode.StatGauge}, d.Kind, d.Name)
		require.False(t, seen[d.WireName()], "stat %s twice", d.Name)
		seen[d.WireName()] = true
	}
	values := func(s *Stats) []uint64 {
		out := make([]uint64, 0, len(StatDescs()))
		for _, d := range StatDescs() {
			out = append(out, d.Value(s))
		}
		return out
	}
	base := values(&Stats{})
	typ := reflect.TypeFor[Stats]()
	for i := range typ.NumField() {
		var s Stats
		f := reflect.ValueOf(&s).Elem().Field(i)
		switch f.Kind() {
		case reflect.Uint64:
			f.SetUint(7777)
		case reflect.Int64:
			f.SetInt(7777)
		default:
			t.Fatalf("field %s: kind %v has no stat encoding", typ.Field(i).Name, f.Kind())
		}
		require.NotEqual(t, base, values(&s), "field %s is read by no stat", typ.Field(i).Name)
	}
}

// A StatsReply fits the reply bound reserved for it before it is built (smallReplyBound).
func TestStatsReplyWithinReservation(t *testing.T) {
	var es storenode.Stats
	var ss Stats
	stats := storenode.AppendStats(nil, storenode.StatDescs(), &es)
	rep := sgio.StatsReply{Stats: storenode.AppendStats(stats, StatDescs(), &ss)}
	require.LessOrEqual(t, sgio.HeaderSize+rep.BodySize(), smallReplyBound)
}
