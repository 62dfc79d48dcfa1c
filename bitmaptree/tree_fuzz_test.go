package bitmaptree

import "testing"

// fuzzShapes map the 16-bit id field of a fuzzed operation into an id space.
var fuzzShapes = []struct{ base, shift uint64 }{
	{0, 0},                 // 64K ids from 0: words and level-1 nodes
	{0, 6},                 // one id per word over 2^22
	{1<<30 - 1<<20, 12},    // one id per level-1 node, across a level-3 boundary
	{0, 20},                // sparse over 2^36
	{MaxID + 1 - 1<<16, 0}, // the top of the id space, and one past it
}

const maxFuzzOps = 1000

// FuzzOps decodes the input as a sequence of operations and runs them against the model:
// byte 0 picks an id-space shape, then each operation takes 4 bytes (kind, id low, id high,
// argument; runs and ranges get 16*argument ids). Inputs stop after maxFuzzOps operations so
// that one input stays fast.
func FuzzOps(f *testing.F) {
	f.Add([]byte{0, byte(opSet), 5, 0, 0, byte(opNextSet), 0, 0, 0, byte(opNextClear), 5, 0, 0})
	f.Add([]byte{0, byte(opSetRun), 0, 0, 255, byte(opRebuild), 0, 0, 0, byte(opClear), 7, 1, 0, byte(opNextClear), 0, 0, 0})
	f.Add([]byte{1, byte(opSet), 1, 0, 0, byte(opSet), 3, 0, 0, byte(opRange), 0, 0, 9, byte(opClone), 0, 0, 0, byte(opCheck), 0, 0, 0})
	f.Add([]byte{2, byte(opSet), 1, 0, 0, byte(opSet), 2, 1, 0, byte(opNextSet), 2, 0, 0, byte(opReset), 0, 0, 0, byte(opTest), 1, 0, 0})
	f.Add([]byte{3, byte(opSet), 255, 255, 0, byte(opNextSet), 0, 0, 0, byte(opTest), 0, 0, 0})
	f.Add([]byte{4, byte(opSetRun), 0, 0, 255, byte(opSetRun), 0, 254, 255, byte(opRebuild), 0, 0, 0,
		byte(opNextClear), 0, 0, 0, byte(opClearRun), 7, 255, 3, byte(opCheck), 0, 0, 0})
	f.Add([]byte{0, byte(opSetWord), 64, 0, 3, byte(opSet), 3, 0, 0, byte(opRebuild), 0, 0, 0, byte(opSetWord), 0, 2, 255, byte(opCheck), 0, 0, 0})
	f.Add([]byte{4, byte(opSetWord), 255, 255, 1, byte(opSetWord), 0, 255, 9, byte(opRebuild), 0, 0, 0, byte(opNextSet), 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		shape := fuzzShapes[int(data[0])%len(fuzzShapes)]
		h := &harness{t: t, tree: New()}
		data = data[1:min(len(data), 1+4*maxFuzzOps)]
		for ; len(data) >= 4; data = data[4:] {
			off := uint64(data[1]) | uint64(data[2])<<8
			o := op{kind: opKind(data[0] % byte(opKinds)), a: min(shape.base+off<<shape.shift, MaxID+1)}
			o.b = uint64(data[3]) * 16
			h.apply(o)
		}
		h.checkAll()
	})
}
