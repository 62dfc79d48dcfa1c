// Package testhook holds the hooks that tests set in the code of the packages under
// cluster/, test-only: no production code sets them, and Go's internal rule keeps them out of
// reach of anything outside cluster/. A hook is set once, before the code under test runs
// (a test child at its start), and never changed after (CoordStep excepted); nil, it costs
// one nil check.
package testhook

import "sync/atomic"

// CoordStep, when set, is called at each step of cluster/node's two-phase commit
// coordinator, on the goroutine that reached it: "prepared" (i: how many prepares answered
// so far), "prepared-all" (i: the participants), "decided" (i: 0), "applying" (i: the part,
// before each Apply sent to it; 0 is the primary's), "applied" (i: how many applies answered
// so far, the decision's or an abort's), "abort-recording" (i: the try, before each
// Decide(abort) a background recorder sends). A multi-process test's child kills itself
// there (cluster/clustertest, NodeProc.KillAt) to crash the coordinator at that step. Atomic,
// unlike the other hooks: an in-process test restores it while the Node it ran still records
// aborts in the background.
var CoordStep atomic.Pointer[func(step string, i int)]

// OwnerWatch, when set, is called in every cluster.Session's owner-key watch goroutine before
// it handles a watch response, with the session's owner id: a test blocks it there to hold
// back what the session hears of its owner keys (a switch's delete). It must return once the
// test ends.
var OwnerWatch func(owner uint64)

// MapWatch, when set, is called in every cluster.MapWatcher's watch goroutine before it
// handles a watch response, with the watcher's *cluster.Client: a test blocks it there to
// hold back what a node hears of the partition map. It must return once the test ends.
var MapWatch func(client any)
