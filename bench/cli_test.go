package bench

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"1MiB": 1 << 20, "1GiB": 1 << 30, "4GiB": 4 << 30, "64K": 64 << 10, "512": 512,
		"1MB": 1_000_000, "1.5GiB": 3 << 29, "2TiB": 2 << 40, "100B": 100,
	} {
		got, err := ParseSize(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "MiB", "1XB", "-1MiB", "1 parsec"} {
		_, err := ParseSize(bad)
		require.Error(t, err, bad)
	}
	got, err := ParseSizes("1MiB, 1GiB")
	require.NoError(t, err)
	require.Equal(t, []int64{1 << 20, 1 << 30}, got)
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{1 << 20: "1MiB", 1 << 30: "1GiB", 3 << 29: "1536MiB", 100: "100B", 64 << 10: "64KiB"} {
		require.Equal(t, want, FormatBytes(n))
	}
}

func TestParseWorkloads(t *testing.T) {
	all, err := ParseWorkloads("all")
	require.NoError(t, err)
	require.Equal(t, Workloads, all)
	got, err := ParseWorkloads("mixed,insert, query-seq")
	require.NoError(t, err)
	require.Equal(t, []string{WorkloadInsert, WorkloadQuerySeq, WorkloadMixed}, got, "run order, not flag order")
	_, err = ParseWorkloads("insert,scan")
	require.Error(t, err)
}

func TestParseFlags(t *testing.T) {
	prog := Program{Name: "crudbench"}
	c, err := parseFlags(prog, nil, io.Discard)
	require.NoError(t, err)
	require.Equal(t, DefaultRecords, c.Records)
	require.Equal(t, DefaultWorkers, c.Workers)
	require.Equal(t, []int64{1 << 20, 1 << 30}, c.Caches)
	require.Equal(t, DefaultDuration, c.Duration)
	require.Equal(t, 64, c.RowBytes)
	require.Equal(t, "durable", c.Durability)
	require.Equal(t, "always", c.Sync)
	require.Equal(t, Workloads, c.Workloads)

	c, err = parseFlags(prog, []string{"--records", "30000000", "--cache", "4GiB", "--duration", "5s", "--async", "16",
		"--workloads", "update-random", "--sync", "none", "--row-size", "128", "--store-cache", "8GiB"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 30_000_000, c.Records)
	require.Equal(t, []int64{4 << 30}, c.Caches)
	require.Equal(t, 5*time.Second, c.Duration)
	require.Equal(t, 16, c.Async)
	require.Equal(t, int64(8<<30), c.StoreCacheBytes)

	for _, bad := range [][]string{
		{"--records", "0"}, {"--row-size", "12"}, {"--sync", "sometimes"}, {"--durability", "maybe"},
		{"--store", "127.0.0.1:7070", "--spawn-store"}, {"--workloads", "scan"}, {"--cache", "big"}, {"extra"},
	} {
		_, err := parseFlags(prog, bad, io.Discard)
		require.Error(t, err, "%q", bad)
	}
	_, err = parseFlags(prog, []string{"--engines", "weft"}, io.Discard)
	require.Error(t, err, "--engines exists only with peers")
	c, err = parseFlags(Program{Name: "peers", Peers: []Factory{{Name: "map"}}}, []string{"--engines", "weft,map"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, []string{"weft", "map"}, c.Engines)
}

func TestLoadRateWaitsForAnHonestRate(t *testing.T) {
	var l loadRate
	t0 := time.Unix(1000, 0)
	require.Empty(t, l.describe(t0, 0), "no rate before the first row")
	require.Empty(t, l.describe(t0.Add(100*time.Millisecond), 5), "first row seen: the clock starts")
	require.Empty(t, l.describe(t0.Add(200*time.Millisecond), 1_000_000), "a rate over 100 ms is not shown")
	require.Equal(t, ", 2.0K rows/s", l.describe(t0.Add(1100*time.Millisecond), 2005))
}
