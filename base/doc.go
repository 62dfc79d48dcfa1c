// Package base holds the nouns every layer of Weft shares, each defined once: the error codes
// and their sentinels (codes.go, errors.go), the commit batch and its segments and fences
// (batch.go, segment.go), page wants, grants and table info (segment.go, table.go), cluster
// layouts and partition names (layout.go, table.go), two-phase-commit ids and decisions
// (txn.go), and stats (stat.go).
//   - The wire (sgio) encodes and decodes them, the engine (storenode) takes and returns them,
//     the stores (txnode/store) pass them through: no copy from one description of a thing to
//     another.
//   - It imports nothing of Weft's but internal helpers (.ci/run checks it), so any package may
//     import it without a cycle or a second role.
//
// Reasons and the layering: docs/architecture.md.
package base
