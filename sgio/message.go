package sgio

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/weftdb/weft/base"
)

// Type is a frame's message type.
type Type uint8

// Message types. Part of the format; do not change.
//
// Requests are 0x01..0x7f, replies 0x80..0xff. A reply's number is its request's number with
// the high bit set, except where one reply answers several requests (TableInfo answers
// CreateTable and OpenTable); Error (0xff) answers any request.
const (
	// Session.
	TypeHello      Type = 0x01 // Hello -> HelloReply
	TypeAuth       Type = 0x02 // Auth -> AuthOK
	TypePing       Type = 0x03 // Ping -> Pong
	TypeHelloReply Type = 0x81
	TypeAuthOK     Type = 0x82
	TypePong       Type = 0x83

	// Catalog.
	TypeCreateTable Type = 0x10 // CreateTable -> TableInfo
	TypeOpenTable   Type = 0x11 // OpenTable -> TableInfo
	TypeListTables  Type = 0x12 // ListTables -> TableList
	TypeDropTable   Type = 0x13 // DropTable -> OK
	// TypeCreateClusterTable creates a cluster-managed table (docs/cluster.md).
	TypeCreateClusterTable Type = 0x14 // CreateClusterTable -> TableInfo
	TypeTableInfo          Type = 0x90
	TypeTableList          Type = 0x92
	TypeOK                 Type = 0x93

	// Ownership and ids.
	TypeAcquire  Type = 0x20 // Acquire -> Grant
	TypeAllocIDs Type = 0x21 // AllocIDs -> IDRange
	TypeRelease  Type = 0x22 // Release -> OK
	TypeGrant    Type = 0xa0
	TypeIDRange  Type = 0xa1

	// Reads.
	TypeReadPages    Type = 0x30 // ReadPages -> Segments
	TypePageDir      Type = 0x31 // PageDir -> PageDirReply
	TypeSegments     Type = 0xb0
	TypePageDirReply Type = 0xb1

	// Writes.
	TypeCommit    Type = 0x40 // Commit -> CommitAck
	TypeCommitAck Type = 0xc0

	// Operations.
	TypeStats       Type = 0x50 // Stats -> StatsReply
	TypeBackup      Type = 0x51 // Backup -> BackupChunk (backup.go)
	TypeStatsReply  Type = 0xd0
	TypeBackupChunk Type = 0xd1

	// Two-phase commit: TypeTxnPrepare .. TypeTxnState, 0x60..0x64 and 0xe1 (txn.go);
	// transactions in doubt: TypeTxnDoubt, TypeTxnDoubtList, 0x65 and 0xe2 (txn_doubt.go).

	// Partition moves: TypeMove, TypeMoveWrite, TypeMoveState, 0x70, 0x71 and 0xf0 (move.go).

	// Failure: the reply to any request.
	TypeError Type = 0xff
)

// SyncMode is the storage node's WAL sync mode, announced in HelloReply.
type SyncMode uint8

// Sync modes. Part of the format; do not change.
const (
	SyncNone   SyncMode = 0 // the WAL is in the OS page cache: survives kill -9, not power loss
	SyncAlways SyncMode = 1 // fdatasync before the ack: survives power loss
)

type typeInfo struct {
	name  string
	reply Type // for a request: the reply that answers it
	make  func() Message
}

var types = [256]typeInfo{
	TypeHello:              {"Hello", TypeHelloReply, func() Message { return new(Hello) }},
	TypeAuth:               {"Auth", TypeAuthOK, func() Message { return new(Auth) }},
	TypePing:               {"Ping", TypePong, func() Message { return new(Ping) }},
	TypeHelloReply:         {"HelloReply", 0, func() Message { return new(HelloReply) }},
	TypeAuthOK:             {"AuthOK", 0, func() Message { return new(AuthOK) }},
	TypePong:               {"Pong", 0, func() Message { return new(Pong) }},
	TypeCreateTable:        {"CreateTable", TypeTableInfo, func() Message { return new(CreateTable) }},
	TypeOpenTable:          {"OpenTable", TypeTableInfo, func() Message { return new(OpenTable) }},
	TypeListTables:         {"ListTables", TypeTableList, func() Message { return new(ListTables) }},
	TypeDropTable:          {"DropTable", TypeOK, func() Message { return new(DropTable) }},
	TypeCreateClusterTable: {"CreateClusterTable", TypeTableInfo, func() Message { return new(CreateClusterTable) }},
	TypeTableInfo:          {"TableInfo", 0, func() Message { return new(TableInfo) }},
	TypeTableList:          {"TableList", 0, func() Message { return new(TableList) }},
	TypeOK:                 {"OK", 0, func() Message { return new(OK) }},
	TypeAcquire:            {"Acquire", TypeGrant, func() Message { return new(Acquire) }},
	TypeAllocIDs:           {"AllocIDs", TypeIDRange, func() Message { return new(AllocIDs) }},
	TypeRelease:            {"Release", TypeOK, func() Message { return new(Release) }},
	TypeGrant:              {"Grant", 0, func() Message { return new(Grant) }},
	TypeIDRange:            {"IDRange", 0, func() Message { return new(IDRange) }},
	TypeReadPages:          {"ReadPages", TypeSegments, func() Message { return new(ReadPages) }},
	TypePageDir:            {"PageDir", TypePageDirReply, func() Message { return new(PageDir) }},
	TypeSegments:           {"Segments", 0, func() Message { return new(Segments) }},
	TypePageDirReply:       {"PageDirReply", 0, func() Message { return new(PageDirReply) }},
	TypeCommit:             {"Commit", TypeCommitAck, func() Message { return new(Commit) }},
	TypeCommitAck:          {"CommitAck", 0, func() Message { return new(CommitAck) }},
	TypeStats:              {"Stats", TypeStatsReply, func() Message { return new(Stats) }},
	TypeStatsReply:         {"StatsReply", 0, func() Message { return new(StatsReply) }},
	TypeBackup:             {"Backup", TypeBackupChunk, func() Message { return new(Backup) }},
	TypeBackupChunk:        {"BackupChunk", 0, func() Message { return new(BackupChunk) }},
	TypeError:              {"Error", 0, func() Message { return new(ErrorReply) }},
	TypeTxnPrepare:         {"TxnPrepare", TypeCommitAck, func() Message { return new(TxnPrepare) }},
	TypeTxnDecide:          {"TxnDecide", TypeTxnState, func() Message { return new(TxnDecide) }},
	TypeTxnApply:           {"TxnApply", TypeOK, func() Message { return new(TxnApply) }},
	TypeTxnAsk:             {"TxnAsk", TypeTxnState, func() Message { return new(TxnAsk) }},
	TypeTxnReport:          {"TxnReport", TypeOK, func() Message { return new(TxnReport) }},
	TypeTxnState:           {"TxnState", 0, func() Message { return new(TxnState) }},
	TypeTxnDoubt:           {"TxnDoubt", TypeTxnDoubtList, func() Message { return new(TxnDoubt) }},
	TypeTxnDoubtList:       {"TxnDoubtList", 0, func() Message { return new(TxnDoubtList) }},
	TypeMove:               {"Move", TypeMoveState, func() Message { return new(Move) }},
	TypeMoveWrite:          {"MoveWrite", TypeCommitAck, func() Message { return new(MoveWrite) }},
	TypeMoveState:          {"MoveState", 0, func() Message { return new(MoveState) }},
}

// Known reports whether t is a message type of this protocol version.
func (t Type) Known() bool { return types[t].name != "" }

// IsRequest reports whether t is a known request type.
func (t Type) IsRequest() bool { return t.Known() && t < 0x80 }

// Reply reports the reply type that answers request type t (besides TypeError), or 0 when t is
// not a request.
func (t Type) Reply() Type { return types[t].reply }

// String reports the type's name, or its number when unknown.
func (t Type) String() string {
	if n := types[t].name; n != "" {
		return n
	}
	return fmt.Sprintf("Type(%#02x)", uint8(t))
}

// NewMessage reports a new zero message of type t, to Parse a body into, or nil when t is not
// Known.
func NewMessage(t Type) Message {
	if !t.Known() {
		return nil
	}
	return types[t].make()
}

// Message is a typed message body. Every message type of the protocol has one struct type; a
// pointer to it is a Message. Methods of one message may be called from one goroutine at a
// time; messages share nothing.
type Message interface {
	// Type reports the message type.
	Type() Type
	// BodySize reports the length of the encoded body, padding included: a multiple of
	// BodyAlign. It is exact for a valid message.
	BodySize() int
	// AppendBody appends the encoded body to dst and returns the extended slice. The message
	// must be valid (Validate); AppendBody does not check it.
	AppendBody(dst []byte) []byte
	// Parse decodes body into the message, replacing its contents and reusing the capacity of
	// its slices. Rows of segments alias body; strings are copied. On error (wrapping
	// ErrMalformed, and ErrTruncated, ErrBadName or ErrBadRowSize where they fit) the message
	// holds partial contents.
	Parse(body []byte) error
	// Validate reports whether the message may be encoded: the rules Parse enforces, checked
	// before sending. Its errors wrap ErrBadName, ErrBadRowSize or ErrMalformed.
	Validate() error
}

// CheckName reports whether name is a valid table or stat name: 1..NameMax bytes of
// [A-Za-z0-9_.-]. The error wraps ErrBadName.
func CheckName(name string) error {
	if len(name) < 1 || len(name) > NameMax {
		return fmt.Errorf("sgio: name of %d bytes, want 1..%d: %w", len(name), NameMax, ErrBadName)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return fmt.Errorf("sgio: name %q: byte %d (%#02x) outside [A-Za-z0-9_.-]: %w", name, i, c, ErrBadName)
		}
	}
	return nil
}

// Encoding helpers. A string is a u16 length and its bytes; a body ends with zero padding to
// a multiple of BodyAlign.

func pad8(n int) int { return (n + BodyAlign - 1) &^ (BodyAlign - 1) }

func strSize(s string) int { return 2 + len(s) }

func appendStr(dst []byte, s string) []byte {
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(s)))
	return append(dst, s...)
}

// appendPad pads the body that starts at dst[start] to a multiple of BodyAlign.
func appendPad(dst []byte, start int) []byte {
	for (len(dst)-start)%BodyAlign != 0 {
		dst = append(dst, 0)
	}
	return dst
}

var (
	le32 = binary.LittleEndian.AppendUint32
	le64 = binary.LittleEndian.AppendUint64
	le16 = binary.LittleEndian.AppendUint16
)

// empty is the body of messages without fields.
type empty struct{}

// BodySize reports 0: the body is empty.
func (empty) BodySize() int { return 0 }

// AppendBody appends nothing.
func (empty) AppendBody(dst []byte) []byte { return dst }

// Validate accepts the message.
func (empty) Validate() error { return nil }

func parseEmpty(t Type, body []byte) error {
	r := bodyReader{t: t, b: body}
	return r.done()
}

// Hello opens a session: the client's protocol version, identity and challenge.
type Hello struct {
	Version uint16          // the client's protocol version (Version)
	MaxBody uint32          // the largest reply body the client accepts
	OwnerID uint64          // the transaction node's owner id
	Nonce   [NonceSize]byte // fresh random challenge for the server (NewNonce)
	// Incarnation is the transaction node's random 128-bit instance id, chosen once per
	// Open and sent in every Hello of that Open: the storage node lets one incarnation hold
	// an owner id at a time (a reconnect of the same incarnation replaces its old
	// connection; another incarnation gets ErrOwnerInUse while the holder is live).
	Incarnation [IncarnationSize]byte
	Name        string // the client's name for logs: empty or a valid name (CheckName)
}

// IncarnationSize is the length of Hello.Incarnation. Part of the format; do not change.
const IncarnationSize = 16

// Type reports TypeHello.
func (*Hello) Type() Type { return TypeHello }

// BodySize reports the encoded body length.
func (m *Hello) BodySize() int { return pad8(64 + strSize(m.Name)) }

// AppendBody appends the encoded body.
func (m *Hello) AppendBody(dst []byte) []byte {
	start := len(dst)
	dst = le16(dst, m.Version)
	dst = le16(dst, 0)
	dst = le32(dst, m.MaxBody)
	dst = le64(dst, m.OwnerID)
	dst = append(dst, m.Nonce[:]...)
	dst = append(dst, m.Incarnation[:]...)
	dst = appendStr(dst, m.Name)
	return appendPad(dst, start)
}

// Parse decodes body.
func (m *Hello) Parse(body []byte) error {
	r := bodyReader{t: TypeHello, b: body}
	m.Version = r.u16()
	r.reserved16()
	m.MaxBody = r.u32()
	m.OwnerID = r.u64()
	m.Nonce = r.bytes32()
	copy(m.Incarnation[:], r.take(IncarnationSize))
	m.Name = r.str(NameMax)
	if m.Name != "" {
		r.check(CheckName(m.Name))
	}
	return r.done()
}

// Validate checks the client name.
func (m *Hello) Validate() error {
	if m.Name != "" {
		return CheckName(m.Name)
	}
	return nil
}

// HelloReply answers Hello: the server's version, sync mode, limits and its challenge for the
// client. It carries no proof: the server proves itself in AuthOK, once the client has.
type HelloReply struct {
	Version     uint16          // the server's protocol version
	SyncMode    SyncMode        // SyncNone or SyncAlways
	MaxBody     uint32          // the largest request body the server accepts, <= MaxBodyLimit
	MaxInflight uint32          // the most requests a connection may have in flight, >= 1
	LeaseMillis uint32          // ownership lease length
	Nonce       [NonceSize]byte // fresh random challenge for the client
}

// Type reports TypeHelloReply.
func (*HelloReply) Type() Type { return TypeHelloReply }

// BodySize reports the encoded body length.
func (*HelloReply) BodySize() int { return 48 }

// AppendBody appends the encoded body.
func (m *HelloReply) AppendBody(dst []byte) []byte {
	dst = le16(dst, m.Version)
	dst = append(dst, byte(m.SyncMode), 0)
	dst = le32(dst, m.MaxBody)
	dst = le32(dst, m.MaxInflight)
	dst = le32(dst, m.LeaseMillis)
	return append(dst, m.Nonce[:]...)
}

// Parse decodes body.
func (m *HelloReply) Parse(body []byte) error {
	r := bodyReader{t: TypeHelloReply, b: body}
	m.Version = r.u16()
	m.SyncMode = SyncMode(r.u8())
	r.reserved8()
	m.MaxBody = r.u32()
	m.MaxInflight = r.u32()
	m.LeaseMillis = r.u32()
	m.Nonce = r.bytes32()
	if r.err == nil {
		r.check(m.Validate())
	}
	return r.done()
}

// Validate checks the sync mode and limits.
func (m *HelloReply) Validate() error {
	switch {
	case m.SyncMode > SyncAlways:
		return fmt.Errorf("sgio: HelloReply: sync mode %d: %w", m.SyncMode, ErrMalformed)
	case m.MaxBody > MaxBodyLimit:
		return fmt.Errorf("sgio: HelloReply: max body %d above %d: %w", m.MaxBody, MaxBodyLimit, ErrMalformed)
	case m.MaxInflight == 0:
		return fmt.Errorf("sgio: HelloReply: max in-flight 0: %w", ErrMalformed)
	}
	return nil
}

// Auth carries the client's proof of the secret (ClientProof).
type Auth struct {
	Proof [ProofSize]byte // ClientProof(secret, server nonce, client nonce)
}

// Type reports TypeAuth.
func (*Auth) Type() Type { return TypeAuth }

// BodySize reports the encoded body length.
func (*Auth) BodySize() int { return ProofSize }

// AppendBody appends the encoded body.
func (m *Auth) AppendBody(dst []byte) []byte { return append(dst, m.Proof[:]...) }

// Parse decodes body.
func (m *Auth) Parse(body []byte) error {
	r := bodyReader{t: TypeAuth, b: body}
	m.Proof = r.bytes32()
	return r.done()
}

// Validate accepts every Auth.
func (*Auth) Validate() error { return nil }

// AuthOK answers Auth when the client's proof held; the session is then open. It carries the
// server's proof of the secret, which the client checks (CheckServerProof) before it trusts
// the session.
type AuthOK struct {
	Proof [ProofSize]byte // ServerProof(secret, client nonce, server nonce)
}

// Type reports TypeAuthOK.
func (*AuthOK) Type() Type { return TypeAuthOK }

// BodySize reports the encoded body length.
func (*AuthOK) BodySize() int { return ProofSize }

// AppendBody appends the encoded body.
func (m *AuthOK) AppendBody(dst []byte) []byte { return append(dst, m.Proof[:]...) }

// Parse decodes body.
func (m *AuthOK) Parse(body []byte) error {
	r := bodyReader{t: TypeAuthOK, b: body}
	m.Proof = r.bytes32()
	return r.done()
}

// Validate accepts every AuthOK.
func (*AuthOK) Validate() error { return nil }

// HandshakeBodyMax reports the largest body of a frame a client may send before it is
// authenticated: a Hello with the longest name (Auth is smaller). A server decodes
// unauthenticated connections with this limit, not its session limit, so a stranger cannot
// make it buffer more than a handshake.
func HandshakeBodyMax() uint32 { return handshakeBodyMax }

var handshakeBodyMax = uint32(max((&Hello{Name: strings.Repeat("n", NameMax)}).BodySize(), (&Auth{}).BodySize()))

// Ping asks for a Pong: keepalive and lease traffic.
type Ping struct{ empty }

// Type reports TypePing.
func (*Ping) Type() Type { return TypePing }

// Parse decodes body, which must be empty.
func (*Ping) Parse(body []byte) error { return parseEmpty(TypePing, body) }

// Pong answers Ping.
type Pong struct{ empty }

// Type reports TypePong.
func (*Pong) Type() Type { return TypePong }

// Parse decodes body, which must be empty.
func (*Pong) Parse(body []byte) error { return parseEmpty(TypePong, body) }

// Stats asks for the server's counters.
type Stats struct{ empty }

// Type reports TypeStats.
func (*Stats) Type() Type { return TypeStats }

// Parse decodes body, which must be empty.
func (*Stats) Parse(body []byte) error { return parseEmpty(TypeStats, body) }

// StatsReply answers Stats.
type StatsReply struct {
	Stats []base.Stat
}

// statMin is the smallest encoded Stat: a one-byte name, padded.
const statMin = 16

// Type reports TypeStatsReply.
func (*StatsReply) Type() Type { return TypeStatsReply }

// BodySize reports the encoded body length.
func (m *StatsReply) BodySize() int {
	n := 8
	for _, s := range m.Stats {
		n += pad8(8 + strSize(s.Name))
	}
	return n
}

// AppendBody appends the encoded body.
func (m *StatsReply) AppendBody(dst []byte) []byte {
	dst = le32(dst, uint32(len(m.Stats)))
	dst = le32(dst, 0)
	for _, s := range m.Stats {
		start := len(dst)
		dst = le64(dst, s.Value)
		dst = appendPad(appendStr(dst, s.Name), start)
	}
	return dst
}

// Parse decodes body.
func (m *StatsReply) Parse(body []byte) error {
	r := bodyReader{t: TypeStatsReply, b: body}
	n := r.count(statMin)
	r.reserved32()
	m.Stats = m.Stats[:0]
	for i := 0; i < n && r.err == nil; i++ {
		v := r.u64()
		m.Stats = append(m.Stats, base.Stat{Name: r.name(), Value: v})
		r.align()
	}
	return r.done()
}

// Validate checks every name.
func (m *StatsReply) Validate() error {
	for i, s := range m.Stats {
		if err := CheckName(s.Name); err != nil {
			return fmt.Errorf("sgio: StatsReply entry %d: %w", i, err)
		}
	}
	return nil
}

// ErrorReply answers any request that failed: a Code and the sender's message.
type ErrorReply struct {
	Code    Code   // nonzero
	Message string // at most ErrorMessageMax bytes
}

// Type reports TypeError.
func (*ErrorReply) Type() Type { return TypeError }

// BodySize reports the encoded body length.
func (m *ErrorReply) BodySize() int { return pad8(2 + strSize(m.Message)) }

// AppendBody appends the encoded body.
func (m *ErrorReply) AppendBody(dst []byte) []byte {
	start := len(dst)
	dst = le16(dst, uint16(m.Code))
	return appendPad(appendStr(dst, m.Message), start)
}

// Parse decodes body.
func (m *ErrorReply) Parse(body []byte) error {
	r := bodyReader{t: TypeError, b: body}
	m.Code = Code(r.u16())
	m.Message = r.str(ErrorMessageMax)
	if r.err == nil {
		r.check(m.Validate())
	}
	return r.done()
}

// Validate checks the code and the message length.
func (m *ErrorReply) Validate() error {
	if m.Code == 0 {
		return fmt.Errorf("sgio: Error reply with code 0: %w", ErrMalformed)
	}
	if len(m.Message) > ErrorMessageMax {
		return fmt.Errorf("sgio: Error reply message of %d bytes, limit %d: %w", len(m.Message), ErrorMessageMax, ErrMalformed)
	}
	return nil
}

// Err reports the error the reply stands for (ErrorFromWire).
func (m *ErrorReply) Err() error { return ErrorFromWire(m.Code, m.Message) }
