// Package base holds the nouns every layer of Weft shares: the error codes and their sentinel
// errors, which the wire (sgio) carries, the engine (storenode) returns and the stores
// (txnode/store) pass through. It imports nothing of Weft's but internal helpers, so the engine
// and the wire can both use it without depending on each other.
package base
