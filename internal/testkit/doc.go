// Package testkit is the module's kit for tests: the harness pieces several packages' tests
// share, so that each suite reads as what it asserts and not as a copy of another's setup.
//
//   - File-system faults (syncs.go): BlockSyncs holds a FaultFS's WAL fsyncs until the test
//     releases them, and fails them with ErrEIO when asked.
//   - Rows (rows.go): Row64, the 64-byte row of the engine's tests.
//   - The race detector (race.go): RaceOn, and SkipUnderRace for the suites of child
//     processes whose leases the race detector would stretch past their budget.
//   - Files and output (files.go): TreeState, a directory tree's state to compare; SyncBuffer, a
//     buffer safe for concurrent writers (a run's or a logger's output).
//   - TLS (tls.go): SelfSigned, TLSConfigs and WriteCert, a fresh certificate for 127.0.0.1.
//   - Cleanup (cleanup.go): CloseAtCleanup, a node's or a session's Close at the test's end,
//     bounded in time.
//   - Helper processes (helper.go): HelperSpec, the spec a parent test hands its re-executed
//     child, skipping the helper when run as a plain test.
//   - Stacks and the system (goroutines.go, sys_*.go): GoroutinesIn, AllocatedBytes, ProcessCPU.
//   - Floods (flood.go): FloodIdleSockets, idle connections opened as fast as a server takes
//     them (the hostile-client tests of the server and of the storenode binary).
//
// Store faults for a transaction node's tests are in internal/testkit/faultstore (it imports
// txnode/store, and so the engine). Seeds and suite sizes are internal/testseed's (Seed, Replay, Scaled), the fake clock
// internal/testclock's; the embedded etcd and its cuttable proxy are cluster/etcdtest's, child
// processes cluster/proctest's.
//
// Only tests import it; it imports none of the module's packages but internal/vfs, so any
// package's internal tests may use it without a cycle. Harnesses that need a package's own
// types (an engine, a transaction node, a cluster client) stay with that package.
package testkit
