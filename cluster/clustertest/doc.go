// Package clustertest is the multi-process cluster harness of Weft's tests: a real etcd,
// storage nodes and cluster nodes as child processes that a test kills (-9), freezes
// (SIGSTOP), resumes and restarts, and the checks that nothing acknowledged was lost.
// Start(t, Options) starts an embedded etcd (cluster/etcdtest, behind its proxy) and N
// storage nodes re-executing the test binary, wired as cmd/storenode -etcd wires them;
// OpenNode opens an in-process cluster node; StartNode(NodeSpec) starts a cluster node in a
// child process running a workload.
//
// Rules:
//
//   - Only tests import it: it links etcd's server, and no production binary imports it.
//   - A storage node keeps its directory and its 127.0.0.1 port across restarts.
//   - A cluster-node child prints every operation on stdout ("try ..." before, "ok ..." or
//     "err ... CLASS MESSAGE" after: the Workload constants), so the parent knows what was
//     acknowledged however the child ends. "mark" on its stdin is answered with "mark"
//     between two operations; closing its stdin ends it gracefully.
//   - Readiness is a line on the child's stdout ("listening", "ready LEASE"), never a sleep;
//     NodeSpec.Pace is a rate, not a synchronisation. Every timer that decides how long a
//     test takes (session TTL, storage node lease, resolver period, grant verification's
//     bound) is injected.
//   - CounterTally checks per-partition counters against one owner chain; the bank test
//     checks every acknowledged transfer's log row and every balance against the log.
//     BankPairs is the one switch of which accounts a transfer pairs.
//   - No child outlives its test (package cluster/proctest).
//
// Every package using the harness defines the children's entry, one line:
//
//	func TestHelperProcess(t *testing.T) { clustertest.HelperProcess(t) }
//
// Reasons and the tests built on it: docs/cluster.md, "Tests".
package clustertest
