package sgio

import (
	"fmt"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/commitbody"
)

// Catalog, ownership and id messages.

// CreateTable creates a table of rows of RowBytes bytes.
type CreateTable struct {
	RowBytes uint16 // commitbody.CheckRowBytes
	Name     string // CheckName
}

// Type reports TypeCreateTable.
func (*CreateTable) Type() Type { return TypeCreateTable }

// BodySize reports the encoded body length.
func (m *CreateTable) BodySize() int { return pad8(2 + strSize(m.Name)) }

// AppendBody appends the encoded body.
func (m *CreateTable) AppendBody(dst []byte) []byte {
	start := len(dst)
	dst = le16(dst, m.RowBytes)
	dst = appendStr(dst, m.Name)
	return appendPad(dst, start)
}

// Parse decodes body.
func (m *CreateTable) Parse(body []byte) error {
	r := bodyReader{t: TypeCreateTable, b: body}
	m.RowBytes = r.u16()
	m.Name = r.name()
	if r.err == nil {
		r.check(commitbody.CheckRowBytes(int(m.RowBytes)))
	}
	return r.done()
}

// Validate checks the name and the row size.
func (m *CreateTable) Validate() error {
	if err := CheckName(m.Name); err != nil {
		return err
	}
	return commitbody.CheckRowBytes(int(m.RowBytes))
}

// checkLayout is l.Validate in the wire's words.
func checkLayout(l *base.ClusterLayout) error {
	if err := l.Validate(); err != nil {
		return fmt.Errorf("sgio: %w", err)
	}
	return nil
}

// appendLayout appends l's encoding: partitions, stripe pages, partition, reserved u32.
func appendLayout(dst []byte, l *base.ClusterLayout) []byte {
	dst = le32(dst, l.Partitions)
	dst = le32(dst, l.StripePages)
	dst = le32(dst, l.Partition)
	return le32(dst, 0)
}

// parseLayout decodes a layout (appendLayout) into l and validates it.
func parseLayout(r *bodyReader, l *base.ClusterLayout) {
	l.Partitions = r.u32()
	l.StripePages = r.u32()
	l.Partition = r.u32()
	r.reserved32()
	if r.err == nil {
		r.check(checkLayout(l))
	}
}

// CreateClusterTable creates a cluster-managed table (docs/cluster.md) of rows of RowBytes
// bytes holding partition Layout.Partition: its grants come from etcd only (Acquire with
// AcquireEtcdGrant), its ids are its partition's. Name is the partition's table name
// (base.PartitionTableName). Answered with TableInfo.
type CreateClusterTable struct {
	RowBytes uint16 // commitbody.CheckRowBytes
	Layout   base.ClusterLayout
	Name     string // CheckName
}

// Type reports TypeCreateClusterTable.
func (*CreateClusterTable) Type() Type { return TypeCreateClusterTable }

// BodySize reports the encoded body length.
func (m *CreateClusterTable) BodySize() int { return pad8(4 + 16 + strSize(m.Name)) }

// AppendBody appends the encoded body.
func (m *CreateClusterTable) AppendBody(dst []byte) []byte {
	start := len(dst)
	dst = le16(dst, m.RowBytes)
	dst = le16(dst, 0)
	dst = appendLayout(dst, &m.Layout)
	dst = appendStr(dst, m.Name)
	return appendPad(dst, start)
}

// Parse decodes body.
func (m *CreateClusterTable) Parse(body []byte) error {
	r := bodyReader{t: TypeCreateClusterTable, b: body}
	m.RowBytes = r.u16()
	r.reserved16()
	parseLayout(&r, &m.Layout)
	m.Name = r.name()
	if r.err == nil {
		r.check(commitbody.CheckRowBytes(int(m.RowBytes)))
	}
	return r.done()
}

// Validate checks the name, the row size and the layout.
func (m *CreateClusterTable) Validate() error {
	if err := CheckName(m.Name); err != nil {
		return err
	}
	if err := checkLayout(&m.Layout); err != nil {
		return err
	}
	return commitbody.CheckRowBytes(int(m.RowBytes))
}

// OpenTable looks a table up by name.
type OpenTable struct {
	Name string // CheckName
}

// Type reports TypeOpenTable.
func (*OpenTable) Type() Type { return TypeOpenTable }

// BodySize reports the encoded body length.
func (m *OpenTable) BodySize() int { return pad8(strSize(m.Name)) }

// AppendBody appends the encoded body.
func (m *OpenTable) AppendBody(dst []byte) []byte { return appendPad(appendStr(dst, m.Name), len(dst)) }

// Parse decodes body.
func (m *OpenTable) Parse(body []byte) error {
	r := bodyReader{t: TypeOpenTable, b: body}
	m.Name = r.name()
	return r.done()
}

// Validate checks the name.
func (m *OpenTable) Validate() error { return CheckName(m.Name) }

// DropTable drops a table by name.
type DropTable struct {
	Name string // CheckName
}

// Type reports TypeDropTable.
func (*DropTable) Type() Type { return TypeDropTable }

// BodySize reports the encoded body length.
func (m *DropTable) BodySize() int { return pad8(strSize(m.Name)) }

// AppendBody appends the encoded body.
func (m *DropTable) AppendBody(dst []byte) []byte { return appendPad(appendStr(dst, m.Name), len(dst)) }

// Parse decodes body.
func (m *DropTable) Parse(body []byte) error {
	r := bodyReader{t: TypeDropTable, b: body}
	m.Name = r.name()
	return r.done()
}

// Validate checks the name.
func (m *DropTable) Validate() error { return CheckName(m.Name) }

// TableInfo answers CreateTable, CreateClusterTable and OpenTable, and is an entry of
// TableList.
type TableInfo struct {
	Table    uint32 // the table id, used by every later request
	RowBytes uint16 // the row size
	NextID   uint64 // the id high-water mark: no row id at or above it was ever granted
	// Cluster is the layout of a cluster-managed table; zero (Partitions 0) for a local one.
	// On the wire: flag TableCluster, then the layout after NextID.
	Cluster base.ClusterLayout
	Name    string // the table's name
}

// TableInfo flags (the u16 after the row size). Part of the format; do not change.
const (
	// TableCluster marks a cluster-managed table; its ClusterLayout follows NextID.
	TableCluster uint16 = 1 << 0
)

// size reports the encoded size of m, unpadded.
func (m *TableInfo) size() int {
	if m.Cluster.Partitions != 0 {
		return 32 + strSize(m.Name)
	}
	return 16 + strSize(m.Name)
}

func (m *TableInfo) appendTo(dst []byte) []byte {
	start := len(dst)
	dst = le32(dst, m.Table)
	dst = le16(dst, m.RowBytes)
	if m.Cluster.Partitions != 0 {
		dst = le16(dst, TableCluster)
		dst = le64(dst, m.NextID)
		dst = appendLayout(dst, &m.Cluster)
	} else {
		dst = le16(dst, 0)
		dst = le64(dst, m.NextID)
	}
	dst = appendStr(dst, m.Name)
	return appendPad(dst, start)
}

func (m *TableInfo) parseFrom(r *bodyReader) {
	m.Table = r.u32()
	m.RowBytes = r.u16()
	flags := r.u16()
	m.NextID = r.u64()
	m.Cluster = base.ClusterLayout{}
	if r.err == nil && flags&^TableCluster != 0 {
		r.fail(4, "unknown table flags %#x", flags)
	}
	if flags&TableCluster != 0 {
		parseLayout(r, &m.Cluster)
	}
	m.Name = r.name()
	if r.err == nil {
		r.check(commitbody.CheckRowBytes(int(m.RowBytes)))
	}
	r.align()
}

// Type reports TypeTableInfo.
func (*TableInfo) Type() Type { return TypeTableInfo }

// BodySize reports the encoded body length.
func (m *TableInfo) BodySize() int { return pad8(m.size()) }

// AppendBody appends the encoded body.
func (m *TableInfo) AppendBody(dst []byte) []byte { return m.appendTo(dst) }

// Parse decodes body.
func (m *TableInfo) Parse(body []byte) error {
	r := bodyReader{t: TypeTableInfo, b: body}
	m.parseFrom(&r)
	return r.done()
}

// Validate checks the name, the row size and a cluster table's layout.
func (m *TableInfo) Validate() error {
	if err := CheckName(m.Name); err != nil {
		return err
	}
	if m.Cluster.Partitions != 0 {
		if err := checkLayout(&m.Cluster); err != nil {
			return err
		}
	}
	return commitbody.CheckRowBytes(int(m.RowBytes))
}

// ListTables asks for every table.
type ListTables struct{ empty }

// Type reports TypeListTables.
func (*ListTables) Type() Type { return TypeListTables }

// Parse decodes body, which must be empty.
func (*ListTables) Parse(body []byte) error { return parseEmpty(TypeListTables, body) }

// TableList answers ListTables.
type TableList struct {
	Tables []TableInfo
}

// tableInfoMin is the smallest encoded TableInfo: a one-byte name, padded.
const tableInfoMin = 24

// Type reports TypeTableList.
func (*TableList) Type() Type { return TypeTableList }

// BodySize reports the encoded body length.
func (m *TableList) BodySize() int {
	n := 8
	for i := range m.Tables {
		n += pad8(m.Tables[i].size())
	}
	return n
}

// AppendBody appends the encoded body.
func (m *TableList) AppendBody(dst []byte) []byte {
	dst = le32(dst, uint32(len(m.Tables)))
	dst = le32(dst, 0)
	for i := range m.Tables {
		dst = m.Tables[i].appendTo(dst)
	}
	return dst
}

// Parse decodes body.
func (m *TableList) Parse(body []byte) error {
	r := bodyReader{t: TypeTableList, b: body}
	n := r.count(tableInfoMin)
	r.reserved32()
	m.Tables = m.Tables[:0]
	for i := 0; i < n && r.err == nil; i++ {
		var ti TableInfo
		ti.parseFrom(&r)
		m.Tables = append(m.Tables, ti)
	}
	return r.done()
}

// Validate checks every entry.
func (m *TableList) Validate() error {
	for i := range m.Tables {
		if err := m.Tables[i].Validate(); err != nil {
			return fmt.Errorf("sgio: TableList entry %d: %w", i, err)
		}
	}
	return nil
}

// OK answers a request that returns nothing (DropTable).
type OK struct{ empty }

// Type reports TypeOK.
func (*OK) Type() Type { return TypeOK }

// Parse decodes body, which must be empty.
func (*OK) Parse(body []byte) error { return parseEmpty(TypeOK, body) }

// Acquire asks for write ownership of a table. Epoch 0 asks for a new grant; a nonzero epoch
// renews or resumes that grant. With AcquireEtcdGrant in Flags it registers an etcd grant of
// a cluster-managed table instead (docs/cluster.md): Epoch is the grant's revision, which the
// storage node verifies in etcd before it answers.
type Acquire struct {
	Table uint32
	Flags uint32 // AcquireEtcdGrant; other bits must be zero
	Owner uint64
	Epoch uint64
}

// Acquire flags. Part of the format; do not change.
const (
	// AcquireEtcdGrant: Epoch is an etcd grant's revision (the owner key's CreateRevision) of
	// a cluster-managed table, nonzero.
	AcquireEtcdGrant uint32 = 1 << 0
)

// Type reports TypeAcquire.
func (*Acquire) Type() Type { return TypeAcquire }

// BodySize reports the encoded body length.
func (*Acquire) BodySize() int { return 24 }

// AppendBody appends the encoded body.
func (m *Acquire) AppendBody(dst []byte) []byte {
	dst = le32(dst, m.Table)
	dst = le32(dst, m.Flags)
	dst = le64(dst, m.Owner)
	return le64(dst, m.Epoch)
}

// Parse decodes body.
func (m *Acquire) Parse(body []byte) error {
	r := bodyReader{t: TypeAcquire, b: body}
	m.Table = r.u32()
	m.Flags = r.u32()
	m.Owner = r.u64()
	m.Epoch = r.u64()
	if r.err == nil {
		r.check(m.Validate())
	}
	return r.done()
}

// Validate refuses unknown flags and an etcd grant of epoch 0.
func (m *Acquire) Validate() error {
	if m.Flags&^AcquireEtcdGrant != 0 {
		return fmt.Errorf("sgio: Acquire with unknown flags %#x: %w", m.Flags, ErrMalformed)
	}
	if m.Flags&AcquireEtcdGrant != 0 && m.Epoch == 0 {
		return fmt.Errorf("sgio: Acquire of an etcd grant of epoch 0: %w", ErrMalformed)
	}
	return nil
}

// Release ends, at once, every ownership lease of Owner (the session's own owner id) and its
// hold on the owner id, so another owner may acquire its tables and another incarnation may
// connect with the id without waiting for a lease. A transaction node sends it from Close,
// after its last batch is durable. Answered with OK.
type Release struct {
	Owner uint64
}

// Type reports TypeRelease.
func (*Release) Type() Type { return TypeRelease }

// BodySize reports the encoded body length.
func (*Release) BodySize() int { return 8 }

// AppendBody appends the encoded body.
func (m *Release) AppendBody(dst []byte) []byte { return le64(dst, m.Owner) }

// Parse decodes body.
func (m *Release) Parse(body []byte) error {
	r := bodyReader{t: TypeRelease, b: body}
	m.Owner = r.u64()
	return r.done()
}

// Validate accepts every Release.
func (*Release) Validate() error { return nil }

// Grant answers Acquire: the ownership grant and the owner's last applied commit seq, so a
// restarted owner continues from it.
type Grant struct {
	Table       uint32
	LeaseMillis uint32
	Owner       uint64
	Epoch       uint64
	LastSeq     uint64
}

// Type reports TypeGrant.
func (*Grant) Type() Type { return TypeGrant }

// BodySize reports the encoded body length.
func (*Grant) BodySize() int { return 32 }

// AppendBody appends the encoded body.
func (m *Grant) AppendBody(dst []byte) []byte {
	dst = le32(dst, m.Table)
	dst = le32(dst, m.LeaseMillis)
	dst = le64(dst, m.Owner)
	dst = le64(dst, m.Epoch)
	return le64(dst, m.LastSeq)
}

// Parse decodes body.
func (m *Grant) Parse(body []byte) error {
	r := bodyReader{t: TypeGrant, b: body}
	m.Table = r.u32()
	m.LeaseMillis = r.u32()
	m.Owner = r.u64()
	m.Epoch = r.u64()
	m.LastSeq = r.u64()
	return r.done()
}

// Validate accepts every Grant.
func (*Grant) Validate() error { return nil }

// AllocIDs asks the table's owner's grant for Pages whole pages of row ids (64 ids each).
type AllocIDs struct {
	Table uint32
	Pages uint32
	Owner uint64
	Epoch uint64
}

// Type reports TypeAllocIDs.
func (*AllocIDs) Type() Type { return TypeAllocIDs }

// BodySize reports the encoded body length.
func (*AllocIDs) BodySize() int { return 24 }

// AppendBody appends the encoded body.
func (m *AllocIDs) AppendBody(dst []byte) []byte {
	dst = le32(dst, m.Table)
	dst = le32(dst, m.Pages)
	dst = le64(dst, m.Owner)
	return le64(dst, m.Epoch)
}

// Parse decodes body.
func (m *AllocIDs) Parse(body []byte) error {
	r := bodyReader{t: TypeAllocIDs, b: body}
	m.Table = r.u32()
	m.Pages = r.u32()
	m.Owner = r.u64()
	m.Epoch = r.u64()
	return r.done()
}

// Validate accepts every AllocIDs.
func (*AllocIDs) Validate() error { return nil }

// IDRange answers AllocIDs: ids First .. First+Count-1, whole pages.
type IDRange struct {
	First uint64
	Count uint64
}

// Type reports TypeIDRange.
func (*IDRange) Type() Type { return TypeIDRange }

// BodySize reports the encoded body length.
func (*IDRange) BodySize() int { return 16 }

// AppendBody appends the encoded body.
func (m *IDRange) AppendBody(dst []byte) []byte { return le64(le64(dst, m.First), m.Count) }

// Parse decodes body.
func (m *IDRange) Parse(body []byte) error {
	r := bodyReader{t: TypeIDRange, b: body}
	m.First = r.u64()
	m.Count = r.u64()
	return r.done()
}

// Validate accepts every IDRange.
func (*IDRange) Validate() error { return nil }
