package cluster

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"
)

// Keys and values in etcd. Everything lives under a prefix (Config.Prefix, "/weft/" by
// default); <t> is a table name, <p> a partition number as 8 lowercase hex digits, so keys
// sort by partition:
//
//	<prefix>map/t/<t>        table:     the table's Layout (written once, at creation)
//	<prefix>map/p/<t>/<p>    partition: the storage node address serving the partition
//	<prefix>own/<t>/<p>      owner:     the holder of the partition, bound to its etcd lease
//
// Values are little-endian, versioned and checksummed (CRC32C over the bytes before it); etcd
// checks its own storage, the checksum catches a foreign writer or a version skew:
//
//	table (20 bytes)
//	  0  u8  version (1)   1 u8 kind (1)   2 u16 reserved (0)
//	  4  u32 partitions    8 u32 stripe pages   12 u32 reserved (0)
//	  16 u32 crc32c of bytes 0..16
//	partition (8 + n bytes)
//	  0  u8  version (1)   1 u8 kind (2)   2 u16 address length n (1..255)
//	  4  n   address (host:port)
//	  4+n u32 crc32c of bytes 0..4+n
//	owner (36 + n bytes)
//	  0  u8  version (1)   1 u8 kind (3)   2 u16 address length n (0..255)
//	  4  u8  flags (bit 0: the holder writes back, so a move asks it to flush first:
//	         moveflush.go; other bits 0)   5 [3] reserved (0)
//	  8  u64 owner id (nonzero)   16 [16] incarnation
//	  32 n   address (where the holder takes requests; may be empty)
//	  32+n u32 crc32c of bytes 0..32+n
//
// The epoch of an owner key is not in its value: it is the key's CreateRevision in etcd.

// Part of the format; do not change.
const (
	valueVersion   = 1
	kindTable      = 1
	kindPartition  = 2
	kindOwner      = 3
	tableValueSize = 20
	addrBytesMax   = 255
	tableNameMax   = 200
)

// keys builds the etcd keys of a prefix.
type keys struct{ prefix string }

func (k keys) mapPrefix() string   { return k.prefix + "map/" }
func (k keys) tablePrefix() string { return k.prefix + "map/t/" }
func (k keys) partPrefix() string  { return k.prefix + "map/p/" }
func (k keys) ownPrefix() string   { return k.prefix + "own/" }
func (k keys) table(t string) string {
	return k.tablePrefix() + t
}
func (k keys) parts(t string) string { return k.partPrefix() + t + "/" }
func (k keys) part(t string, p uint32) string {
	return fmt.Sprintf("%s%08x", k.parts(t), p)
}
func (k keys) owners(t string) string { return k.ownPrefix() + t + "/" }
func (k keys) owner(t string, p uint32) string {
	return fmt.Sprintf("%s%08x", k.owners(t), p)
}

// parsePartKey splits the rest of a key after a "<t>/" prefix... of the form <t>/<p>.
func parseTablePart(rest string) (string, uint32, error) {
	i := strings.LastIndexByte(rest, '/')
	if i <= 0 || len(rest)-i-1 != 8 {
		return "", 0, corrupt.Errorf("cluster: malformed key %q", rest)
	}
	var p uint32
	for _, c := range rest[i+1:] {
		var d uint32
		switch {
		case c >= '0' && c <= '9':
			d = uint32(c - '0')
		case c >= 'a' && c <= 'f':
			d = uint32(c-'a') + 10
		default:
			return "", 0, corrupt.Errorf("cluster: malformed partition in key %q", rest)
		}
		p = p<<4 | d
	}
	return rest[:i], p, nil
}

// validTableName reports ErrInvalid for a name that cannot be a key segment.
func validTableName(name string) error {
	if name == "" || len(name) > tableNameMax {
		return fmt.Errorf("%w: table name of %d bytes (1..%d)", ErrInvalid, len(name), tableNameMax)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c == '/' || c < 0x20 || c == 0x7f {
			return fmt.Errorf("%w: table name %q holds '/' or a control character", ErrInvalid, name)
		}
	}
	return nil
}

func validAddr(addr string, empty bool) error {
	if len(addr) > addrBytesMax || (!empty && addr == "") {
		return fmt.Errorf("%w: address %q (1..%d bytes)", ErrInvalid, addr, addrBytesMax)
	}
	return nil
}

func appendCRC(b []byte) []byte { return binary.LittleEndian.AppendUint32(b, checksum.Of(b)) }

// checkValue checks a value's version, kind, length and checksum.
func checkValue(b []byte, kind byte, sizeMin int) error {
	if len(b) < sizeMin {
		return corrupt.Errorf("cluster: value of kind %d: %d bytes, want at least %d", kind, len(b), sizeMin)
	}
	if b[0] != valueVersion || b[1] != kind {
		return corrupt.Errorf("cluster: value version %d kind %d, want version %d kind %d", b[0], b[1], valueVersion, kind)
	}
	body := b[:len(b)-4]
	if got, want := binary.LittleEndian.Uint32(b[len(b)-4:]), checksum.Of(body); got != want {
		return corrupt.Errorf("cluster: value of kind %d: checksum %08x, want %08x", kind, got, want)
	}
	return nil
}

func encodeTable(l Layout) []byte {
	b := make([]byte, 0, tableValueSize)
	b = append(b, valueVersion, kindTable, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, l.Partitions)
	b = binary.LittleEndian.AppendUint32(b, l.StripePages)
	b = binary.LittleEndian.AppendUint32(b, 0)
	return appendCRC(b)
}

func decodeTable(b []byte) (Layout, error) {
	if len(b) != tableValueSize {
		return Layout{}, corrupt.Errorf("cluster: table value of %d bytes, want %d", len(b), tableValueSize)
	}
	if err := checkValue(b, kindTable, tableValueSize); err != nil {
		return Layout{}, err
	}
	if binary.LittleEndian.Uint16(b[2:]) != 0 || binary.LittleEndian.Uint32(b[12:]) != 0 {
		return Layout{}, corrupt.Errorf("cluster: table value: reserved bytes set")
	}
	l := Layout{Partitions: binary.LittleEndian.Uint32(b[4:]), StripePages: binary.LittleEndian.Uint32(b[8:])}
	if err := l.Validate(); err != nil {
		return Layout{}, corrupt.Errorf("cluster: table value: %w", err)
	}
	return l, nil
}

func encodePartition(addr string) []byte {
	b := make([]byte, 0, 8+len(addr))
	b = append(b, valueVersion, kindPartition)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(addr)))
	b = append(b, addr...)
	return appendCRC(b)
}

func decodePartition(b []byte) (string, error) {
	if err := checkValue(b, kindPartition, 8); err != nil {
		return "", err
	}
	n := int(binary.LittleEndian.Uint16(b[2:]))
	if n == 0 || n > addrBytesMax || len(b) != 8+n {
		return "", corrupt.Errorf("cluster: partition value: address of %d bytes in a %d-byte value", n, len(b))
	}
	return string(b[4 : 4+n]), nil
}

// ownerWriteBack is the owner value's flag of a holder that writes back.
const ownerWriteBack = 1

func encodeOwner(h Holder) []byte {
	b := make([]byte, 0, 36+len(h.Addr))
	b = append(b, valueVersion, kindOwner)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(h.Addr)))
	var flags byte
	if h.WriteBack {
		flags |= ownerWriteBack
	}
	b = append(b, flags, 0, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, h.Owner)
	b = append(b, h.Incarnation[:]...)
	b = append(b, h.Addr...)
	return appendCRC(b)
}

// decodeOwner decodes an owner value; the caller sets Epoch from the key's CreateRevision.
func decodeOwner(b []byte) (Holder, error) {
	if err := checkValue(b, kindOwner, 36); err != nil {
		return Holder{}, err
	}
	n := int(binary.LittleEndian.Uint16(b[2:]))
	if n > addrBytesMax || len(b) != 36+n {
		return Holder{}, corrupt.Errorf("cluster: owner value: address of %d bytes in a %d-byte value", n, len(b))
	}
	if b[4]&^ownerWriteBack != 0 || b[5] != 0 || b[6] != 0 || b[7] != 0 {
		return Holder{}, corrupt.Errorf("cluster: owner value: reserved bits set")
	}
	h := Holder{Owner: binary.LittleEndian.Uint64(b[8:]), Addr: string(b[32 : 32+n]), WriteBack: b[4]&ownerWriteBack != 0}
	copy(h.Incarnation[:], b[16:32])
	if h.Owner == 0 {
		return Holder{}, corrupt.Errorf("cluster: owner value: owner id 0")
	}
	return h, nil
}
