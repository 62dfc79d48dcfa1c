package main

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// A layout decodes a row into named fields, as given on the command line:
//
//	--layout 'kind:u32,owner:u64,hp:i16,_:pad2,pos:f32x3,name:str16'
//
// Fields are little-endian, at consecutive offsets from 0 (pad skips bytes). Types: u8 u16
// u32 u64, i8 i16 i32 i64, f32 f64, bool (one byte), strN (N bytes, up to the first NUL),
// hexN (N bytes as hex), padN (N bytes skipped, name ignored). A numeric type may repeat:
// f32x3 is three f32s. Bytes after the last field are not shown.
type layout struct {
	fields []field
	size   int
}

type field struct {
	name  string
	kind  fieldKind
	width int // bytes of one element (or of the whole field for str, hex, pad)
	count int // elements: 1, or N of xN
}

type fieldKind uint8

const (
	kindUint fieldKind = iota
	kindInt
	kindFloat
	kindBool
	kindStr
	kindHex
	kindPad
)

// layoutTypes and layoutHelp are the layout's types as --help and a bad --layout list them.
const (
	layoutTypes = "u8 u16 u32 u64 i8 i16 i32 i64 f32 f64 bool strN hexN padN, a numeric type repeated as f32x3"
	layoutHelp  = "NAME:TYPE,... little-endian fields at consecutive offsets, e.g. 'kind:u32,owner:u64,_:pad4,pos:f32x3,name:str16'; types " + layoutTypes
)

// errLayout reports a --layout that cannot be parsed or does not fit the row.
var errLayout = errors.New("bad --layout")

// layoutFieldsMax bounds the fields of one layout.
const layoutFieldsMax = 1024

// parseLayout parses spec for rows of rowBytes bytes.
func parseLayout(spec string, rowBytes int) (*layout, error) {
	l := &layout{}
	parts := strings.Split(spec, ",")
	if len(parts) > layoutFieldsMax {
		return nil, fmt.Errorf("%w: %d fields, at most %d", errLayout, len(parts), layoutFieldsMax)
	}
	for _, part := range parts {
		name, typ, ok := strings.Cut(strings.TrimSpace(part), ":")
		if !ok || name == "" || typ == "" {
			return nil, fmt.Errorf("%w: field %q: want name:type", errLayout, part)
		}
		f, err := parseField(name, typ)
		if err != nil {
			return nil, err
		}
		l.size += f.width * f.count
		if l.size > rowBytes {
			return nil, fmt.Errorf("%w: fields up to %q need %d bytes, the rows have %d", errLayout, name, l.size, rowBytes)
		}
		l.fields = append(l.fields, f)
	}
	return l, nil
}

func parseField(name, typ string) (field, error) {
	f := field{name: name, count: 1}
	for _, p := range []struct {
		prefix string
		kind   fieldKind
	}{{"str", kindStr}, {"hex", kindHex}, {"pad", kindPad}} {
		size, ok := strings.CutPrefix(typ, p.prefix)
		if !ok {
			continue
		}
		n, err := strconv.Atoi(size)
		if err != nil || n < 1 || n > 4096 {
			return f, fmt.Errorf("%w: field %q: %s needs a size of 1 to 4096 bytes (%s16)", errLayout, name, p.prefix, p.prefix)
		}
		f.kind, f.width = p.kind, n
		return f, nil
	}
	base, rep, hasRep := strings.Cut(typ, "x")
	if hasRep {
		n, err := strconv.Atoi(rep)
		if err != nil || n < 1 || n > 4096 {
			return f, fmt.Errorf("%w: field %q: repeat %q: want 1 to 4096", errLayout, name, rep)
		}
		f.count = n
	}
	switch base {
	case "u8", "u16", "u32", "u64":
		f.kind = kindUint
	case "i8", "i16", "i32", "i64":
		f.kind = kindInt
	case "f32", "f64":
		f.kind = kindFloat
	case "bool":
		f.kind = kindBool
		f.width = 1
		return f, nil
	default:
		return f, fmt.Errorf("%w: field %q: unknown type %q (types: %s)", errLayout, name, typ, layoutTypes)
	}
	bitsN, _ := strconv.Atoi(base[1:])
	f.width = bitsN / 8
	return f, nil
}

// format appends the fields of row as "name=value" pairs separated by spaces.
func (l *layout) format(dst []byte, row []byte) []byte {
	off := 0
	first := true
	for _, f := range l.fields {
		b := row[off : off+f.width*f.count]
		off += f.width * f.count
		if f.kind == kindPad {
			continue
		}
		if !first {
			dst = append(dst, ' ')
		}
		first = false
		dst = append(dst, f.name...)
		dst = append(dst, '=')
		switch f.kind {
		case kindStr:
			if i := strings.IndexByte(string(b), 0); i >= 0 {
				b = b[:i]
			}
			dst = strconv.AppendQuote(dst, string(b))
			continue
		case kindHex:
			dst = hex.AppendEncode(dst, b)
			continue
		}
		if f.count > 1 {
			dst = append(dst, '[')
		}
		for i := range f.count {
			if i > 0 {
				dst = append(dst, ' ')
			}
			dst = appendScalar(dst, f.kind, b[i*f.width:(i+1)*f.width])
		}
		if f.count > 1 {
			dst = append(dst, ']')
		}
	}
	return dst
}

func appendScalar(dst []byte, kind fieldKind, b []byte) []byte {
	var u uint64
	switch len(b) {
	case 1:
		u = uint64(b[0])
	case 2:
		u = uint64(binary.LittleEndian.Uint16(b))
	case 4:
		u = uint64(binary.LittleEndian.Uint32(b))
	case 8:
		u = binary.LittleEndian.Uint64(b)
	}
	switch kind {
	case kindUint:
		return strconv.AppendUint(dst, u, 10)
	case kindInt:
		shift := 64 - 8*len(b)
		return strconv.AppendInt(dst, int64(u<<shift)>>shift, 10)
	case kindFloat:
		if len(b) == 4 {
			return strconv.AppendFloat(dst, float64(math.Float32frombits(uint32(u))), 'g', -1, 32)
		}
		return strconv.AppendFloat(dst, math.Float64frombits(u), 'g', -1, 64)
	case kindBool:
		return strconv.AppendBool(dst, u != 0)
	}
	return dst
}
