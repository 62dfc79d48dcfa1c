package main

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLayout(t *testing.T) {
	row := make([]byte, 64)
	binary.LittleEndian.PutUint16(row[0:], 0xfffe)                   // i16 -2
	binary.LittleEndian.PutUint32(row[2:], math.Float32bits(1.5))    // f32
	binary.LittleEndian.PutUint32(row[6:], math.Float32bits(-2.25))  // f32
	binary.LittleEndian.PutUint64(row[10:], math.Float64bits(1e100)) // f64
	row[18] = 1                                                      // bool
	copy(row[19:], "abc")                                            // str8
	row[27], row[28] = 0xde, 0xad                                    // hex2
	binary.LittleEndian.PutUint64(row[33:], 1<<63)                   // u64 after pad4
	l, err := parseLayout("a:i16,p:f32x2,d:f64,ok:bool,name:str8,h:hex2,_:pad4,big:u64", len(row))
	require.NoError(t, err)
	require.Equal(t, `a=-2 p=[1.5 -2.25] d=1e+100 ok=true name="abc" h=dead big=9223372036854775808`, string(l.format(nil, row)))

	for _, bad := range []string{
		"", "a", "a:", ":u8", "a:u7", "a:str", "a:str0", "a:hexz", "a:u8x0", "a:u8x", "a:u8xx2",
		"a:hex70", "a:u64x9", "a:f16", "a:pad65",
	} {
		_, err := parseLayout(bad, 64)
		require.ErrorIs(t, err, errLayout, "%q", bad)
	}
}

// FuzzLayout checks that any layout either fails to parse or decodes any row of its size
// without panicking.
func FuzzLayout(f *testing.F) {
	f.Add("a:u8,b:i64,c:f32x3,d:str5,e:hex3,_:pad1,f:boolx2", 64)
	f.Add("x:u8x4096", 4096)
	f.Fuzz(func(t *testing.T, spec string, rowBytes int) {
		if rowBytes < 8 || rowBytes > 4096 {
			return
		}
		l, err := parseLayout(spec, rowBytes)
		if err != nil {
			return
		}
		require.LessOrEqual(t, l.size, rowBytes)
		l.format(nil, make([]byte, rowBytes))
	})
}
