// Package bench is Weft's CRUD throughput benchmark: the workloads of the source article's
// table (insert, update and query with random and sequential ids, plus delete and a zipfian
// mixed workload), run by one suite of code against any store behind the Backend interface, so
// Weft and its baselines (bench/peers) are measured by the same code in the same run.
//
// A run is a list of engines times a list of txn-node cache sizes. For each pair the table of
// Config.Records rows is loaded once, then every selected workload runs for Config.Duration
// with Config.Workers goroutines, each operation one transaction. Latencies go into one HDR
// histogram per worker, merged at the end of the workload. Results print as the source's table
// (workload x cache size), as Go benchmark lines for benchstat, and optionally as JSON.
//
// Weft runs embedded, against a storage node (--store), against a storage node child
// (--spawn-store, spawn.go) or as a cluster (--cluster N, cluster.go: etcd in this process, N
// storage node children, one cluster/node.Node owning every partition). Every child process
// is stopped at the end of the run, on error and on an interrupt, and exits by itself when its
// stdin closes (the parent died).
//
// cmd/crudbench is a thin main over Main; bench/peers (its own module) calls Main with the
// peer engines added.
package bench
