package bitmaptree

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"
)

// encodeRaw builds an encoding around a hand-written body, with a correct length and CRC.
func encodeRaw(words, count uint64, body []byte) []byte {
	b := make([]byte, headerSize, headerSize+len(body))
	le.PutUint32(b[offMagic:], formatMagic)
	le.PutUint16(b[offVersion:], formatVersion)
	le.PutUint64(b[offBodyLen:], uint64(len(body)))
	le.PutUint64(b[offWords:], words)
	le.PutUint64(b[offCount:], count)
	return refix(append(b, body...))
}

// refix recomputes the CRC of b in place, so a test reaches the check behind it.
func refix(b []byte) []byte {
	le.PutUint32(b[offCRC:], checksum.Update(checksum.Of(b[:offCRC]), b[headerSize:]))
	return b
}

func runHeader(n, kind uint64) []byte { return binary.AppendUvarint(nil, n<<runKindBits|kind) }

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// goldenBody uses every run kind; goldenIDs is what it holds.
var (
	goldenBody = cat(
		[]byte{1<<3 | runSetBits, 2, 1, 1},     // word 0: ids 1, 3
		[]byte{1<<3 | runZero},                 // word 1: nothing
		[]byte{2<<3 | runOnes},                 // words 2-3: ids 128..255
		[]byte{1<<3 | runWords},                // word 4: ids 256, 319
		le.AppendUint64(nil, 1<<63|1),          //
		[]byte{2<<3 | runClearBits, 2, 0, 126}, // words 5-6: ids 320..447 but 320 and 447
	)
	goldenIDs = func() []uint64 {
		ids := []uint64{1, 3}
		for i := uint64(128); i < 256; i++ {
			ids = append(ids, i)
		}
		ids = append(ids, 256, 319)
		for i := uint64(321); i < 447; i++ {
			ids = append(ids, i)
		}
		return ids
	}()
)

// TestFormatGolden pins the format: a hand-written encoding decodes to the known ids, and the
// encoder's output for a small tree is byte for byte what it was when the format was fixed.
func TestFormatGolden(t *testing.T) {
	tr, err := Unmarshal(encodeRaw(7, uint64(len(goldenIDs)), goldenBody))
	require.NoError(t, err)
	require.Equal(t, goldenIDs, collect(tr.All()))

	b, err := treeOf(1, 3).MarshalBinary()
	require.NoError(t, err)
	require.Equal(t, []byte{
		'W', 'F', 'B', 'T', // magic
		1, 0, // version
		0, 0, // flags
		4, 0, 0, 0, 0, 0, 0, 0, // body length
		1, 0, 0, 0, 0, 0, 0, 0, // words
		2, 0, 0, 0, 0, 0, 0, 0, // count
		0xaa, 0x2d, 0x92, 0xeb, // CRC32C
		1<<3 | runSetBits, 2, 1, 1, // one word, set bits 1 and 3
	}, b)

	b, err = New().MarshalBinary()
	require.NoError(t, err)
	require.Equal(t, encodeRaw(0, 0, nil), b)
}

func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	random := func(n, span uint64, density float64) *Tree {
		tr := New()
		for range n {
			if x := r.Uint64N(span); r.Float64() < density {
				tr.Set(x)
			}
		}
		return tr
	}
	runs := func(spans ...uint64) *Tree {
		tr := New()
		for i := 0; i+1 < len(spans); i += 2 {
			for x := spans[i]; x < spans[i+1]; x++ {
				tr.Set(x)
			}
		}
		return tr
	}
	alternating := New()
	for i := uint64(0); i < 10000; i += 2 {
		alternating.Set(i)
	}
	for name, tr := range map[string]*Tree{
		"empty":        New(),
		"zero":         treeOf(0),
		"MaxID":        treeOf(MaxID),
		"edges":        treeOf(0, 63, 64, 4095, 4096, 1<<18-1, 1<<18, 1<<36, MaxID),
		"full node":    runs(0, 4096),
		"full level 2": runs(5, 1<<18*2+100, 1<<20, 1<<20+4096*3),
		"tail to max":  runs(MaxID-5000, MaxID+1),
		"alternating":  alternating,
		"sparse 2^36":  random(2000, 1<<36, 1),
		"sparse":       random(20000, 1<<21, 1),
		"dense":        runsMinus(r, 1<<20, 0.01),
	} {
		t.Run(name, func(t *testing.T) {
			b, err := tr.MarshalBinary()
			require.NoError(t, err)
			n := reload(t, tr)
			require.Equal(t, collect(tr.All()), collect(n.All()))
			require.Equal(t, tr.Count(), n.Count())
			again, err := n.AppendBinary([]byte("prefix"))
			require.NoError(t, err)
			require.Equal(t, append([]byte("prefix"), b...), again)
		})
	}
}

// runsMinus returns ids [0, n) but a random fraction.
func runsMinus(r *rand.Rand, n uint64, fraction float64) *Tree {
	tr := New()
	for i := range n {
		if r.Float64() >= fraction {
			tr.Set(i)
		}
	}
	return tr
}

// TestEncodedSize checks that sparse, dense and run-shaped trees encode small.
func TestEncodedSize(t *testing.T) {
	const n = 3_000_000
	rawBytes := n / 8
	r := rand.New(rand.NewPCG(7, 8))
	sparse := New()
	for i := range uint64(n) {
		if r.Float64() < 0.01 {
			sparse.Set(i)
		}
	}
	full := New()
	for i := range uint64(n) {
		full.Set(i)
	}
	for name, c := range map[string]struct {
		tr       *Tree
		maxBytes int
	}{
		"sparse 1%": {sparse, rawBytes / 8},
		"dense 99%": {runsMinus(r, n, 0.01), rawBytes / 8},
		"all set":   {full, 64},
		"far apart": {treeOf(1, 1<<40), 64},
	} {
		b, err := c.tr.MarshalBinary()
		require.NoError(t, err)
		t.Logf("%s: %d ids in %d bytes (%.3f bytes per id; raw bitmap %d bytes)", name, c.tr.Count(), len(b),
			float64(len(b))/float64(max(c.tr.Count(), 1)), rawBytes)
		require.LessOrEqual(t, len(b), c.maxBytes, name)
	}
}

func TestUnmarshalRejects(t *testing.T) {
	valid := encodeRaw(7, uint64(len(goldenIDs)), goldenBody)
	_, err := Unmarshal(valid)
	require.NoError(t, err)
	edit := func(f func(b []byte)) []byte {
		b := append([]byte(nil), valid...)
		f(b)
		return refix(b)
	}
	cases := []struct {
		name string
		data []byte
		want error
	}{
		{"empty", nil, ErrFormat},
		{"short header", valid[:headerSize-1], ErrFormat},
		{"magic", edit(func(b []byte) { b[offMagic] ^= 1 }), ErrFormat},
		{"version 0", edit(func(b []byte) { b[offVersion] = 0 }), ErrVersion},
		{"version 2", edit(func(b []byte) { b[offVersion] = 2 }), ErrVersion},
		{"flags", edit(func(b []byte) { b[offFlags+1] = 0x80 }), ErrFormat},
		{"checksum", func() []byte { b := append([]byte(nil), valid...); b[offCRC] ^= 1; return b }(), ErrChecksum},
		{"body bit flip", func() []byte { b := append([]byte(nil), valid...); b[len(b)-1] ^= 4; return b }(), ErrChecksum},
		{"truncated", refix(append([]byte(nil), valid[:len(valid)-1]...)), ErrFormat},
		{"trailing byte", refix(append(append([]byte(nil), valid...), 0)), ErrFormat},
		{"huge body length", edit(func(b []byte) { le.PutUint64(b[offBodyLen:], 1<<63) }), ErrFormat},
		{"too many words", encodeRaw(maxWords+1, 0, runHeader(maxWords+1, runZero)), ErrFormat},
		{"count beyond words", encodeRaw(1, 65, runHeader(1, runOnes)), ErrFormat},
		{"count too high", edit(func(b []byte) { b[offCount]++ }), ErrFormat},
		{"count too low", edit(func(b []byte) { b[offCount]-- }), ErrFormat},
		{"zero-length run", encodeRaw(1, 0, cat(runHeader(0, runZero), runHeader(1, runZero))), ErrFormat},
		{"run past words", encodeRaw(1, 0, runHeader(2, runZero)), ErrFormat},
		{"kind 5", encodeRaw(1, 0, runHeader(1, 5)), ErrFormat},
		{"kind 7", encodeRaw(1, 0, runHeader(1, 7)), ErrFormat},
		{"varint overflow", encodeRaw(1, 0, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}), ErrFormat},
		{"varint cut", encodeRaw(1, 0, []byte{0x80}), ErrFormat},
		{"runs missing", encodeRaw(2, 0, runHeader(1, runZero)), ErrFormat},
		{"run after words", encodeRaw(1, 0, cat(runHeader(1, runZero), runHeader(1, runZero))), ErrFormat},
		{"literal cut", encodeRaw(2, 1, cat(runHeader(2, runWords), le.AppendUint64(nil, 1))), ErrFormat},
		{"huge literal", encodeRaw(maxWords, 1, cat(runHeader(maxWords, runWords), le.AppendUint64(nil, 1))), ErrFormat},
		{"position count cut", encodeRaw(1, 0, cat(runHeader(1, runSetBits), []byte{0x80})), ErrFormat},
		{"no positions", encodeRaw(1, 0, cat(runHeader(1, runSetBits), []byte{0})), ErrFormat},
		{"more positions than bits", encodeRaw(1, 64, cat(runHeader(1, runSetBits), []byte{65}, make([]byte, 65))), ErrFormat},
		{"more positions than bytes", encodeRaw(1, 3, cat(runHeader(1, runSetBits), []byte{3, 0, 0})), ErrFormat},
		{"huge position count", encodeRaw(maxWords, 1, cat(runHeader(maxWords, runSetBits), binary.AppendUvarint(nil, 1<<40), []byte{0})), ErrFormat},
		{"position beyond run", encodeRaw(1, 1, cat(runHeader(1, runSetBits), []byte{1, 64})), ErrFormat},
		{"position wraps", encodeRaw(1, 2, cat(runHeader(1, runClearBits), []byte{2, 0}, binary.AppendUvarint(nil, ^uint64(0)))), ErrFormat},
		{"position cut", encodeRaw(1, 2, cat(runHeader(1, runSetBits), []byte{2, 0, 0x80})), ErrFormat},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr, err := Unmarshal(c.data)
			require.Error(t, err)
			require.Nil(t, tr)
			require.ErrorIs(t, err, corrupt.ErrCorruption)
			require.ErrorIs(t, err, c.want)
			require.Contains(t, err.Error(), "bitmaptree: decode: ")
		})
	}
}

// TestUnmarshalAllocation feeds inputs whose lengths claim the whole id space and checks that
// the decoder allocates in proportion to the input, not to the claims.
func TestUnmarshalAllocation(t *testing.T) {
	for name, data := range map[string][]byte{
		"huge literal claim":  encodeRaw(maxWords, 1, cat(runHeader(maxWords, runWords), le.AppendUint64(nil, 1))),
		"huge position count": encodeRaw(maxWords, 1, cat(runHeader(maxWords, runSetBits), binary.AppendUvarint(nil, 1<<40), []byte{0})),
		"all ids set":         encodeRaw(maxWords, MaxID+1, runHeader(maxWords, runOnes)),
		"all but one clear":   encodeRaw(maxWords, MaxID, cat(runHeader(maxWords, runClearBits), []byte{1}, binary.AppendUvarint(nil, MaxID/2))),
		"lie about count":     encodeRaw(maxWords, MaxID+1, runHeader(maxWords, runZero)),
	} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		tr, err := Unmarshal(data)
		runtime.ReadMemStats(&after)
		t.Logf("%s: err %v, %d bytes allocated", name, err, after.TotalAlloc-before.TotalAlloc)
		require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<10), name)
		if err == nil {
			require.NoError(t, tr.verify())
		}
	}
}

// TestUnmarshalMemoryPerByte builds the encodings that make the decoder allocate most per
// input byte (positions just far enough apart that each opens new nodes) and checks the
// bound that Unmarshal documents.
func TestUnmarshalMemoryPerByte(t *testing.T) {
	for _, gap := range []uint64{1 << 12, 1 << 18, 1<<21 - 1, 1 << 24, 1<<28 - 1} {
		k := min(20000, MaxID/gap)
		body := cat(runHeader(maxWords, runSetBits), binary.AppendUvarint(nil, k))
		for range k {
			body = binary.AppendUvarint(body, gap-1)
		}
		data := encodeRaw(maxWords, k, body)
		tr, err := Unmarshal(data)
		require.NoError(t, err)
		perByte := float64(tr.usedBytes()) / float64(len(data))
		t.Logf("gap %d: %d input bytes, %d bytes of nodes: %.0f per input byte", gap, len(data), tr.usedBytes(), perByte)
		require.Less(t, perByte, float64(maxNodeBytesPerInputByte))
	}
}

// maxNodeBytesPerInputByte is the documented bound on node memory per input byte of Unmarshal.
const maxNodeBytesPerInputByte = 300

func TestUnmarshalBinary(t *testing.T) {
	tr := treeOf(1, 2, 3)
	b, err := treeOf(7, 1<<30).MarshalBinary()
	require.NoError(t, err)

	require.Error(t, tr.UnmarshalBinary(b[:len(b)-1]))
	require.Equal(t, []uint64{1, 2, 3}, collect(tr.All()), "unchanged on error")

	var got []uint64
	for x := range tr.All() {
		got = append(got, x)
		require.NoError(t, tr.UnmarshalBinary(b))
	}
	require.Equal(t, []uint64{1, 7, 1 << 30}, got, "an iteration goes on over the loaded tree")
	require.Equal(t, []uint64{7, 1 << 30}, collect(tr.All()))
}

func TestErrorsAreDistinct(t *testing.T) {
	for _, e := range []error{ErrChecksum, ErrVersion, ErrFormat} {
		require.False(t, errors.Is(e, corrupt.ErrCorruption), "the sentinels are wrapped with the marker, not built on it")
	}
}
