// Package fencetest holds the end-to-end tests of fencing by etcd grant revision
// (docs/cluster.md, "How it plugs in"): a storage node verifying grants against a real etcd
// (cluster/etcdtest), the floors it persists, a restored copy's floor, and a transaction
// node frozen past its etcd lease. It has no code of its own: it exists so that these tests,
// which link the storage node's server, the transaction node and etcd's server, stay out of
// package cluster's test binary (and its goroutine-leak check).
package fencetest
