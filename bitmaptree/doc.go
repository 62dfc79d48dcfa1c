// Package bitmaptree is Weft's one index structure: a set of uint64 ids kept as a 64-ary
// hierarchy of bitmaps. The storage node keeps one per auto-increment table over row ids (bit
// set = row present; a leaf word is a logical page's present mask) and answers "which pages
// of [lo, hi) hold rows" and "how many rows" from it; another tracks free disk pages of a data
// file (NextClear finds a free page, past the end if need be). Leaf words hold one bit per id;
// every summary node holds two words over its 64 children, any (bit c: child c holds a set
// id) and notFull (bit c: child c holds a clear id):
//
//	level h  root    [any|notFull] [ref 0|ref 1| ... |ref 63]        64^(h+1) ids
//	                                  |      |
//	                        +---------+      +--> ref 0 or 1: a shared node (below)
//	                        v
//	level 2          [any|notFull] [ref 0| ... |ref 63]              262144 ids
//	                                  |
//	                        +---------+
//	                        v
//	level 1 (block)  [any|notFull] [word 0|word 1| ... |word 63]     4096 ids
//	                   |     |        |
//	                   |     |        +-- bit b of word w = id base + 64w + b
//	                   |     +----------- bit w: word w != all ones ("some clear below")
//	                   +----------------- bit w: word w != 0        ("some set below")
//
//	directory        dir[b] --> the level-1 node of ids [4096b, 4096b+4096), for the
//	                 blocks nearest 0
//
// Rules:
//
//   - Pure data structure: no IO, no locks, no goroutines. Use a Tree from one goroutine at a
//     time, or guard it (any number of readers or one writer).
//   - Ids are 0..MaxID (2^42 - 1). Set above MaxID panics through internal/assert; Test,
//     Clear and the queries treat such ids as clear.
//   - Refs 0 and 1 of every level are shared nodes, all clear and all set, never written:
//     Set and Clear copy one into a private node before writing below it.
//   - Count is O(1); Test, Set, Clear, NextSet, NextClear and Last cost O(levels) words
//     whatever the density. All, Range and Words go in increasing order and their loop body
//     may change the tree. The hot paths do not allocate.
//   - Nodes are not freed before Reset; MemBytes reports the memory.
//   - A tree has no serialised form: the storage node rebuilds it from the page map (SetWord,
//     one present mask a leaf word), the only persisted copy.
//
// Reasons, history and measurements: docs/bitmaptree.md.
package bitmaptree
