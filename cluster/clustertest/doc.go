// Package clustertest is the multi-process cluster harness of Weft's tests (docs/cluster.md,
// "Tests"): a real etcd, storage nodes and cluster nodes as child processes that a test kills
// (-9), freezes (SIGSTOP), resumes and restarts, and the checks that nothing acknowledged was
// lost. Only tests import it; it links etcd's server (cluster/etcdtest) and no production
// binary imports it.
//
// # The cluster
//
// Start(t, Options) starts an embedded etcd (cluster/etcdtest, behind its proxy: Etcd.Stop and
// Restart take the server down and up, Etcd.Cut takes the network away with the server
// running, so leases expire) and N storage nodes, each a child process re-executing the test
// binary, in its own directory, on a 127.0.0.1 port kept across restarts, with the cluster's
// secret, verifying etcd grants as cmd/storenode -etcd does (cluster.GrantVerifier, the etcd
// client as the resolver's lease checker, a TxnPeer). StorageNode embeds proctest.Proc:
// Kill, Restart (same directory and port; waits for the "listening" line), Stop, Cont.
// OpenNode opens an in-process cluster node (node.Node) of the cluster.
//
// # Cluster-node children
//
// StartNode(NodeSpec) starts a cluster node (node.Node) in a child process running a
// workload, and waits for its "ready LEASE" line. It reports every operation on stdout, line
// by line ("try ..." before, "ok ..." or "err ... CLASS MESSAGE" after: see the Workload
// constants), so the parent knows what was acknowledged however the child ends. A "mark" on
// its stdin is answered with "mark" between two operations; closing its stdin ends it
// gracefully (it closes its node). With Reown it takes its partitions again under a new
// session after a lost grant ("reopen LEASE").
//
// Every package using the harness defines the children's entry, one line:
//
//	func TestHelperProcess(t *testing.T) { clustertest.HelperProcess(t) }
//
// # Timers
//
// Everything that decides how long a test takes is injected: the session TTL (NodeSpec.TTL,
// cluster.TTLMin by default, etcd's shortest), each storage node's lease (Options
// .LeaseDuration, 2 s: the transaction nodes re-register their grants every quarter of it),
// the resolver's period and the grant verification's bound. Readiness is a line on the
// child's stdout, never a sleep; the workloads' pace (NodeSpec.Pace) is a rate, not a
// synchronisation.
//
// # Checks
//
// CounterTally checks per-partition counters against one owner chain (its doc says why that
// proves no write was acknowledged without ownership); the bank test checks every
// acknowledged transfer's log row and every balance against the log. BankPairs is the one
// switch of which accounts a transfer pairs: one storage node today, any two once node.Update
// commits across storage nodes.
//
// No child outlives its test: see package cluster/proctest.
package clustertest
