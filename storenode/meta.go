package storenode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/bits"
	"path"
	"slices"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
)

// The meta file is what a checkpoint publishes: the checkpoint LSN, the catalog, the ownership
// grants, the owners' last applied seqs (the dedup table) and the root of the map log (the
// page maps' file, maplog.go), in one checksummed file replaced atomically (write meta.tmp,
// fsync, rename to meta, fsync the directory): the one commit point of a checkpoint. Recovery
// loads it and the map log through its published length, then replays the WAL after its LSN.
// All integers little-endian.
//
//	+---------------------------------------------------------------+
//	| magic "WEFTMETA" 8 | version u32 (4) | reserved u32            |  header, 64 bytes
//	| checkpoint LSN u64 | next table id u32 | table count u32       |
//	| owner count u32 | reserved u32 | synced LSN u64                |
//	| map log generation u64 (0: none) | map log length u64          |
//	+---------------------------------------------------------------+
//	| per table: id u32 | row bytes u16 | name len u16 | next id u64 |
//	|   holder u64 | epoch u64 | leaf count u32 | entry count u32 |   |
//	|   name, zero-padded to 8 bytes                                 |
//	+---------------------------------------------------------------+
//	| per owner (ascending id): owner u64 | last seq u64 |            |
//	|   last LSN u64 | window count u32 | reserved u32 |              |
//	|   window count entries, oldest first:                          |
//	|   seq u64 | LSN u64 | batch hash u64                           |
//	+---------------------------------------------------------------+
//	| version 5 only: cluster count u32 | reserved u32 |             |
//	|   per cluster-managed table (ascending id): id u32 |          |
//	|   partitions u32 | stripe pages u32 | partition u32           |
//	+---------------------------------------------------------------+
//	| version 6 only (after the cluster section, whose count may be  |
//	|   0): txnstate index u64 (= checkpoint LSN) | reserved u64      |
//	+---------------------------------------------------------------+
//	| crc32c u32 over everything before it | reserved u32            |
//	+---------------------------------------------------------------+
//
// Version 5 is version 4 with the cluster section: the layouts of the cluster-managed tables
// (cluster.go). A checkpoint writes it only when the catalog holds a cluster table, and
// version 4, byte for byte as before, otherwise: a store that never had one stays readable by
// the builds before. Each entry names a table of the catalog, at most once; its layout is
// valid and the table's name is its partition's.
//
// The synced LSN is the WAL's synced-through LSN when the checkpoint was published (>= the
// checkpoint LSN): recovery treats a bad WAL record at or below it as corruption, never as a
// torn tail. A checkpoint taken inside replay publishes at least the synced LSN of the meta
// file recovery loaded (those records stay proved durable). The owner windows are the dedup table (dedup.go); a window's seqs are
// consecutive and end at the owner's last seq. A table's leaf and entry counts are its page
// map's: the map log must decode to them.
//
// Version 6 is a replica's (Options.Proposer set, docs/replication.md 1.2): version 5 whose
// cluster section may be empty, followed by the replica section naming the checkpoint's
// transaction state sidecar, txnstate-<index> (txnstate.go), which holds the two-phase commit
// parts, decisions and move states a standalone checkpoint carries in the WAL instead. Every
// checkpoint of a replica writes version 6 and its sidecar; a standalone store never writes
// it (version 4 or 5, byte for byte as before). The index equals the checkpoint LSN.
//
// Versions 3 and 2 are read and upgraded (the next checkpoint writes a map log and version 4).
// Version 3 is the same file with a 48-byte header (no map log fields) and each table's
// sparse page map after its name: leaf count leaf records, ascending, of leaf index u32 |
// reserved u32 | entry mask u64 (non-zero) | popcount(mask) page-map entries in slot order;
// a page-map entry (24 bytes) is disk page+1 u32 (0: none) | crc32c of the disk page u32 |
// page LSN u64 | present u64, never all zero. Version 2 has a dense page map instead: a u64
// page count in place of the two u32 counts and page count entries, zero for a page without
// a copy. Version 1 (no windows, no batch hash in commit records) is refused with
// ErrOldFormat.
//
// Part of the format; do not change.
const (
	metaMagic          = "WEFTMETA"
	metaVersion        = 4
	metaVersionCluster = 5 // version 4 and the cluster section
	metaVersionReplica = 6 // version 5, its cluster section possibly empty, and the replica section
	metaVersionSparse  = 3 // read and upgraded: the page map inside the meta file
	metaVersionDense   = 2 // read and upgraded: a dense page map
	metaHeaderBytes    = 48
	metaV4HeaderBytes  = 64 // version 4 adds the map log's generation u64 and published length u64
	metaTableBytes     = 40
	metaLeafBytes      = 16
	metaEntryBytes     = 24
	metaOwnerBytes     = 32
	metaClusterBytes   = 16 // one entry of the cluster section
	metaReplicaBytes   = 16 // the replica section (version 6)
	metaDedupBytes     = 24
	metaTrailerBytes   = 8
	metaName           = "meta"
	metaTempName       = "meta.tmp"
)

// mapEntry is one page-map entry: where the page's durable copy lives and how to check it.
// The checksum is kept here, away from the data, so a page written to the wrong place is caught.
type mapEntry struct {
	disk    uint32 // disk page index + 1; 0 = no durable copy
	crc     uint32 // CRC32C of the whole disk page
	lsn     uint64 // page LSN when it was copied
	present uint64 // present mask at the copy
}

type metaTable struct {
	id       uint32
	rowBytes int
	name     string
	nextID   uint64
	holder   uint64
	epoch    uint64
	pages    *pageMap // sealed
	cluster  base.ClusterLayout
	// densePages is the page count of a version-2 (dense) map as read: Check's offsets follow
	// the layout read. 0 for version 3.
	densePages uint64
	// Version 4: the counts the meta file holds (decodeMapLog checks the log against them)
	// and, for Check, the offset in the map log of each entry (decodeMapLog).
	wantLeaves, wantEntries uint64
	entryOff                map[uint64]int64
	logFile                 string // version 4: the map log's name, relative to the store
}

type metaState struct {
	version   uint32 // as read; encodeMeta writes metaVersion, or metaVersionCluster with a cluster table
	ckptLSN   uint64
	syncedLSN uint64
	nextTable uint32
	tables    []metaTable
	owners    map[uint64]ownerState
	logGen    uint64 // version 4: the map log's generation (0: none, every map empty)
	logLen    uint64 // version 4: the map log's published length
	mapLog    []byte // the map log's bytes, when a backup read them
	// txnState is the checkpoint index of the transaction state sidecar the meta file names
	// (version 6, a replica's; 0: none, versions 2 to 5).
	txnState uint64
	// txnEntries is a replica's checkpoint's sidecar, captured with the snapshot and written
	// before the meta file (checkpoint only).
	txnEntries []txnStateEntry
}

func encodeMeta(m *metaState) []byte {
	size := metaV4HeaderBytes + metaTrailerBytes
	for _, o := range m.owners {
		size += metaOwnerBytes + o.n*metaDedupBytes
	}
	clusters := 0
	for _, t := range m.tables {
		size += metaTableBytes + pad8(len(t.name))
		if t.cluster.IsCluster() {
			clusters++
		}
	}
	version := uint32(metaVersion)
	switch {
	case m.txnState != 0:
		version = metaVersionReplica
		size += 8 + clusters*metaClusterBytes + metaReplicaBytes
	case clusters > 0:
		version = metaVersionCluster
		size += 8 + clusters*metaClusterBytes
	}
	b := make([]byte, 0, size)
	b = append(b, metaMagic...)
	b = binary.LittleEndian.AppendUint32(b, version)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, m.ckptLSN)
	b = binary.LittleEndian.AppendUint32(b, m.nextTable)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.tables)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.owners)))
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, m.syncedLSN)
	b = binary.LittleEndian.AppendUint64(b, m.logGen)
	b = binary.LittleEndian.AppendUint64(b, m.logLen)
	for _, t := range m.tables {
		b = binary.LittleEndian.AppendUint32(b, t.id)
		b = binary.LittleEndian.AppendUint16(b, uint16(t.rowBytes))
		b = binary.LittleEndian.AppendUint16(b, uint16(len(t.name)))
		b = binary.LittleEndian.AppendUint64(b, t.nextID)
		b = binary.LittleEndian.AppendUint64(b, t.holder)
		b = binary.LittleEndian.AppendUint64(b, t.epoch)
		leaves, entries := uint32(t.pages.leafCount()), uint32(t.pages.count())
		if t.pages == nil { // decoded from a version-4 file, its map log not read: keep its counts
			leaves, entries = uint32(t.wantLeaves), uint32(t.wantEntries)
		}
		b = binary.LittleEndian.AppendUint32(b, leaves)
		b = binary.LittleEndian.AppendUint32(b, entries)
		b = append(b, t.name...)
		b = append(b, make([]byte, pad8(len(t.name))-len(t.name))...)
	}
	for _, o := range sortedOwners(m.owners) {
		s := m.owners[o]
		b = binary.LittleEndian.AppendUint64(b, o)
		b = binary.LittleEndian.AppendUint64(b, s.lastSeq)
		b = binary.LittleEndian.AppendUint64(b, s.lastLSN)
		ents := s.entries()
		b = binary.LittleEndian.AppendUint32(b, uint32(len(ents)))
		b = binary.LittleEndian.AppendUint32(b, 0)
		for _, d := range ents {
			b = binary.LittleEndian.AppendUint64(b, d.seq)
			b = binary.LittleEndian.AppendUint64(b, d.lsn)
			b = binary.LittleEndian.AppendUint64(b, d.hash)
		}
	}
	if version >= metaVersionCluster {
		b = binary.LittleEndian.AppendUint32(b, uint32(clusters))
		b = binary.LittleEndian.AppendUint32(b, 0)
		for _, t := range m.tables { // ascending id: the catalog's order
			if t.cluster.IsCluster() {
				b = binary.LittleEndian.AppendUint32(b, t.id)
				b = binary.LittleEndian.AppendUint32(b, t.cluster.Partitions)
				b = binary.LittleEndian.AppendUint32(b, t.cluster.StripePages)
				b = binary.LittleEndian.AppendUint32(b, t.cluster.Partition)
			}
		}
	}
	if version == metaVersionReplica {
		b = binary.LittleEndian.AppendUint64(b, m.txnState)
		b = binary.LittleEndian.AppendUint64(b, 0)
	}
	b = binary.LittleEndian.AppendUint32(b, checksum.Of(b))
	b = binary.LittleEndian.AppendUint32(b, 0)
	return b
}

// appendLeaf appends one leaf record of the page map (its own function: the closure that
// calls it must not keep b in a captured variable across every entry's append).
func appendLeaf(b []byte, leaf, mask uint64, ents []mapEntry) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(leaf))
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, mask)
	for _, e := range ents {
		b = binary.LittleEndian.AppendUint32(b, e.disk)
		b = binary.LittleEndian.AppendUint32(b, e.crc)
		b = binary.LittleEndian.AppendUint64(b, e.lsn)
		b = binary.LittleEndian.AppendUint64(b, e.present)
	}
	return b
}

func decodeMeta(b []byte) (*metaState, error) {
	if len(b) < metaHeaderBytes+metaTrailerBytes {
		return nil, corrupt.Errorf("storenode: meta: %d bytes", len(b))
	}
	body := b[:len(b)-metaTrailerBytes]
	if got, want := checksum.Of(body), binary.LittleEndian.Uint32(b[len(body):]); got != want {
		return nil, corrupt.Errorf("storenode: meta: offset %d: checksum %#08x stored, %#08x computed over bytes [0, %d)",
			len(body), want, got, len(body))
	}
	if binary.LittleEndian.Uint32(b[len(b)-4:]) != 0 {
		return nil, corrupt.Errorf("storenode: meta: reserved trailer field not zero")
	}
	if string(b[:8]) != metaMagic {
		return nil, corrupt.Errorf("storenode: meta: bad magic %q", b[:8])
	}
	version := binary.LittleEndian.Uint32(b[8:])
	if version != metaVersionReplica && version != metaVersionCluster && version != metaVersion && version != metaVersionSparse && version != metaVersionDense {
		if v := version; v < metaVersionDense {
			return nil, fmt.Errorf("%w: meta file format version %d, this build reads versions %d to %d only "+
				"(open the store with the build that wrote it and export its rows)", ErrOldFormat, v, metaVersionDense, metaVersion)
		}
		return nil, corrupt.Errorf("storenode: meta: version %d, want %d..%d", version, metaVersionDense, metaVersionReplica)
	}
	m := &metaState{
		version:   version,
		ckptLSN:   binary.LittleEndian.Uint64(b[16:]),
		syncedLSN: binary.LittleEndian.Uint64(b[40:]),
		nextTable: binary.LittleEndian.Uint32(b[24:]),
	}
	nTables := binary.LittleEndian.Uint32(b[28:])
	nOwners := binary.LittleEndian.Uint32(b[32:])
	if binary.LittleEndian.Uint32(b[12:]) != 0 || binary.LittleEndian.Uint32(b[36:]) != 0 || m.syncedLSN < m.ckptLSN {
		return nil, corrupt.Errorf("storenode: meta: bad header")
	}
	hdrBytes := metaHeaderBytes
	if version >= metaVersion {
		if len(body) < metaV4HeaderBytes {
			return nil, corrupt.Errorf("storenode: meta: %d bytes", len(b))
		}
		hdrBytes = metaV4HeaderBytes
		m.logGen, m.logLen = binary.LittleEndian.Uint64(b[48:]), binary.LittleEndian.Uint64(b[56:])
		if m.logGen == 0 && m.logLen != 0 || m.logGen != 0 && m.logLen < mapLogHeaderBytes {
			return nil, corrupt.Errorf("storenode: meta: bad header")
		}
	}
	p := body[hdrBytes:]
	if uint64(nTables)*metaTableBytes+uint64(nOwners)*metaOwnerBytes > uint64(len(p)) {
		return nil, corrupt.Errorf("storenode: meta: %d tables and %d owners in %d bytes", nTables, nOwners, len(p))
	}
	m.owners = make(map[uint64]ownerState, nOwners) // nOwners is bounded by the bytes just above
	seen := make(map[uint32]bool, nTables)
	for range nTables {
		if len(p) < metaTableBytes {
			return nil, corrupt.Errorf("storenode: meta: truncated table header")
		}
		t := metaTable{
			id:       binary.LittleEndian.Uint32(p),
			rowBytes: int(binary.LittleEndian.Uint16(p[4:])),
			nextID:   binary.LittleEndian.Uint64(p[8:]),
			holder:   binary.LittleEndian.Uint64(p[16:]),
			epoch:    binary.LittleEndian.Uint64(p[24:]),
		}
		nameLen := int(binary.LittleEndian.Uint16(p[6:]))
		nLeaves, nEntries := uint64(binary.LittleEndian.Uint32(p[32:])), uint64(binary.LittleEndian.Uint32(p[36:]))
		need := nLeaves*metaLeafBytes + nEntries*metaEntryBytes
		if version >= metaVersion {
			need = 0
			t.wantLeaves, t.wantEntries = nLeaves, nEntries
		} else if version == metaVersionDense {
			t.densePages = binary.LittleEndian.Uint64(p[32:])
			need = t.densePages * metaEntryBytes
			if t.densePages > tablePagesMax {
				need = ^uint64(0)
			}
		}
		p = p[metaTableBytes:]
		if pad8(nameLen) > len(p) || need > uint64(len(p)-pad8(nameLen)) {
			return nil, corrupt.Errorf("storenode: meta: table %d: name of %d bytes and a page map of %d bytes in %d bytes",
				t.id, nameLen, need, len(p))
		}
		t.name = string(p[:nameLen])
		p = p[pad8(nameLen):]
		if _, err := logicpage.NewGeometry(t.rowBytes); err != nil || checkName(t.name) != nil || t.id == 0 ||
			t.id >= m.nextTable || seen[t.id] {
			return nil, corrupt.Errorf("storenode: meta: bad table %d %q row size %d", t.id, t.name, t.rowBytes)
		}
		seen[t.id] = true
		var err error
		if version >= metaVersion {
			// decodeMapLog fills t.pages
		} else if version == metaVersionDense {
			t.pages, p = decodeDensePageMap(p, t.densePages)
		} else if t.pages, p, err = decodePageMap(p, nLeaves, nEntries); err != nil {
			return nil, fmt.Errorf("storenode: meta: table %d: %w", t.id, err)
		}
		m.tables = append(m.tables, t)
	}
	if uint64(len(p)) < uint64(nOwners)*metaOwnerBytes {
		return nil, corrupt.Errorf("storenode: meta: %d bytes for %d owners", len(p), nOwners)
	}
	prev := uint64(0)
	for i := range nOwners {
		if len(p) < metaOwnerBytes {
			return nil, corrupt.Errorf("storenode: meta: truncated owner %d", i)
		}
		id := binary.LittleEndian.Uint64(p)
		o := ownerState{lastSeq: binary.LittleEndian.Uint64(p[8:]), lastLSN: binary.LittleEndian.Uint64(p[16:])}
		n := binary.LittleEndian.Uint32(p[24:])
		if id == 0 || id <= prev && i > 0 || n > dedupWindow || binary.LittleEndian.Uint32(p[28:]) != 0 ||
			uint64(n) > o.lastSeq || o.lastLSN > m.ckptLSN {
			return nil, corrupt.Errorf("storenode: meta: bad owner entry %d", i)
		}
		prev = id
		p = p[metaOwnerBytes:]
		if uint64(len(p)) < uint64(n)*metaDedupBytes {
			return nil, corrupt.Errorf("storenode: meta: owner entry %d: window of %d in %d bytes", i, n, len(p))
		}
		if n > 0 {
			// Exactly n entries, allocated after the bytes that hold them were checked: a
			// window costs memory in proportion to its bytes in the file (applied grows it).
			o.window = make([]dedupEntry, n)
			o.n = int(n)
			for k := range uint64(n) {
				d := dedupEntry{seq: binary.LittleEndian.Uint64(p), lsn: binary.LittleEndian.Uint64(p[8:]),
					hash: binary.LittleEndian.Uint64(p[16:])}
				if d.seq != o.lastSeq-uint64(n)+1+k || d.lsn > o.lastLSN || d.lsn == 0 {
					return nil, corrupt.Errorf("storenode: meta: owner entry %d: bad window entry %d", i, k)
				}
				o.window[d.seq%uint64(n)] = d
				p = p[metaDedupBytes:]
			}
		}
		m.owners[id] = o
	}
	if version >= metaVersionCluster {
		var err error
		if p, err = decodeMetaClusters(p, m, version == metaVersionReplica); err != nil {
			return nil, err
		}
	}
	if version == metaVersionReplica {
		if len(p) < metaReplicaBytes {
			return nil, corrupt.Errorf("storenode: meta: truncated replica section")
		}
		m.txnState = binary.LittleEndian.Uint64(p)
		if m.txnState != m.ckptLSN || m.txnState == 0 || binary.LittleEndian.Uint64(p[8:]) != 0 {
			return nil, corrupt.Errorf("storenode: meta: replica section names txnstate %d, checkpoint LSN %d", m.txnState, m.ckptLSN)
		}
		p = p[metaReplicaBytes:]
	}
	if len(p) != 0 {
		return nil, corrupt.Errorf("storenode: meta: %d trailing bytes", len(p))
	}
	return m, nil
}

// decodeMetaClusters decodes a version-5 (or 6) cluster section into m's tables and returns the
// rest of p. Entries ascend by id, each naming one of m's tables, with a valid layout that the
// table's name agrees with; there is at least one (version 4 has none) unless empty is allowed
// (version 6 always has the section).
func decodeMetaClusters(p []byte, m *metaState, empty bool) ([]byte, error) {
	if len(p) < 8 {
		return nil, corrupt.Errorf("storenode: meta: truncated cluster section")
	}
	n := uint64(binary.LittleEndian.Uint32(p))
	if n == 0 && !empty || n > uint64(len(m.tables)) || binary.LittleEndian.Uint32(p[4:]) != 0 || uint64(len(p)-8) < n*metaClusterBytes {
		return nil, corrupt.Errorf("storenode: meta: cluster section of %d entries for %d tables in %d bytes", n, len(m.tables), len(p))
	}
	p = p[8:]
	k := 0 // the catalog's tables, in the file's order: ascending ids, as encodeMeta writes them
	prev := uint32(0)
	for i := range n {
		id := binary.LittleEndian.Uint32(p)
		cl := base.ClusterLayout{Partitions: binary.LittleEndian.Uint32(p[4:]), StripePages: binary.LittleEndian.Uint32(p[8:]),
			Partition: binary.LittleEndian.Uint32(p[12:])}
		p = p[metaClusterBytes:]
		if i > 0 && id <= prev {
			return nil, corrupt.Errorf("storenode: meta: cluster entry %d: table %d after %d", i, id, prev)
		}
		prev = id
		for k < len(m.tables) && m.tables[k].id != id {
			k++
		}
		if k == len(m.tables) {
			return nil, corrupt.Errorf("storenode: meta: cluster entry %d: table %d is not in the catalog (or out of order)", i, id)
		}
		t := &m.tables[k]
		if err := checkClusterEntry(t.rowBytes, t.name, cl); err != nil {
			return nil, corrupt.Errorf("storenode: meta: cluster entry %d: table %d: %v", i, id, err)
		}
		t.cluster = cl
	}
	return p, nil
}

// decodePageMap decodes the nLeaves leaf records of a version-3 page map (their nEntries
// entries' bytes were checked to be in p) into a sealed pageMap, and returns the rest of p.
// Leaves must ascend, masks be non-zero, entries non-zero and the counts agree.
func decodePageMap(p []byte, nLeaves, nEntries uint64) (*pageMap, []byte, error) {
	pm := (*pageMap)(nil).edit()
	var entries, prevLeaf uint64
	for k := range nLeaves {
		if len(p) < metaLeafBytes {
			return nil, nil, corrupt.Errorf("truncated leaf record %d", k)
		}
		leaf := uint64(binary.LittleEndian.Uint32(p))
		mask := binary.LittleEndian.Uint64(p[8:])
		n := uint64(bits.OnesCount64(mask))
		if mask == 0 || binary.LittleEndian.Uint32(p[4:]) != 0 || leaf >= tablePagesMax/logicpage.RowsPerPage ||
			k > 0 && leaf <= prevLeaf || entries+n > nEntries {
			return nil, nil, corrupt.Errorf("bad leaf record %d (leaf %d, mask %#x)", k, leaf, mask)
		}
		p = p[metaLeafBytes:]
		if uint64(len(p)) < n*metaEntryBytes {
			return nil, nil, corrupt.Errorf("leaf record %d: %d entries in %d bytes", k, n, len(p))
		}
		for ; mask != 0; mask &= mask - 1 {
			ent := mapEntry{
				disk:    binary.LittleEndian.Uint32(p),
				crc:     binary.LittleEndian.Uint32(p[4:]),
				lsn:     binary.LittleEndian.Uint64(p[8:]),
				present: binary.LittleEndian.Uint64(p[16:]),
			}
			if ent == (mapEntry{}) {
				return nil, nil, corrupt.Errorf("leaf record %d: an empty entry", k)
			}
			pm.set(leaf*logicpage.RowsPerPage+uint64(bits.TrailingZeros64(mask)), ent)
			p = p[metaEntryBytes:]
		}
		entries += n
		prevLeaf = leaf
	}
	if entries != nEntries {
		return nil, nil, corrupt.Errorf("%d entries in the leaves, %d in the header", entries, nEntries)
	}
	return pm.seal(), p, nil
}

// decodeDensePageMap decodes a version-2 page map of nPages entries (checked to be in p),
// dropping its zero entries, and returns the rest of p.
func decodeDensePageMap(p []byte, nPages uint64) (*pageMap, []byte) {
	pm := (*pageMap)(nil).edit()
	for page := range nPages {
		ent := mapEntry{
			disk:    binary.LittleEndian.Uint32(p),
			crc:     binary.LittleEndian.Uint32(p[4:]),
			lsn:     binary.LittleEndian.Uint64(p[8:]),
			present: binary.LittleEndian.Uint64(p[16:]),
		}
		if ent != (mapEntry{}) {
			pm.set(page, ent)
		}
		p = p[metaEntryBytes:]
	}
	return pm.seal(), p
}

// publishMeta makes m the store's durable state: write a temporary file, fsync it, rename it
// over the meta file, fsync the directory. A crash at any point leaves the old meta or the new.
func publishMeta(fs vfs.FS, dir string, m *metaState) error {
	_, err := publishMetaRenamed(fs, dir, m)
	return err
}

// publishMetaRenamed is publishMeta; renamed reports that the new meta file was renamed into
// place (a failure after it is of the directory sync, retried while out of file
// descriptors: syncDirRenamed).
func publishMetaRenamed(fs vfs.FS, dir string, m *metaState) (renamed bool, err error) {
	b := encodeMeta(m)
	tmp := path.Join(dir, metaTempName)
	f, err := fs.Create(tmp)
	if err != nil {
		return false, fmt.Errorf("storenode: publish checkpoint: %w", err)
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		f.Close()
		return false, fmt.Errorf("storenode: publish checkpoint: write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return false, fmt.Errorf("storenode: publish checkpoint: sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return false, fmt.Errorf("storenode: publish checkpoint: close %s: %w", tmp, err)
	}
	if err := fs.Rename(tmp, path.Join(dir, metaName)); err != nil {
		return false, fmt.Errorf("storenode: publish checkpoint: %w", err)
	}
	if err := syncDirRenamed(fs, dir); err != nil {
		return true, fmt.Errorf("storenode: publish checkpoint: sync dir: %w", err)
	}
	return true, nil
}

// loadMeta reads the published meta and its map log; ok is false when there is none (a new
// store).
func loadMeta(fs vfs.FS, dir string) (m *metaState, ok bool, err error) {
	return loadMetaOffsets(fs, dir, false)
}

// loadMetaOffsets is loadMeta, recording the map log's entry offsets when offsets (Check).
func loadMetaOffsets(fs vfs.FS, dir string, offsets bool) (m *metaState, ok bool, err error) {
	name := path.Join(dir, metaName)
	f, err := fs.Open(name)
	if err != nil {
		if isNotExist(err) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("storenode: open %s: %w", name, err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return nil, false, fmt.Errorf("storenode: size of %s: %w", name, err)
	}
	if size > metaBytesMax {
		return nil, false, corrupt.Errorf("storenode: %s: size %d", name, size)
	}
	if size > metaStreamBytes {
		if err := precheckMeta(f, size); err != nil {
			return nil, false, fmt.Errorf("storenode: %s: %w", name, err)
		}
	}
	b := make([]byte, size)
	if _, err := f.ReadAt(b, 0); err != nil {
		return nil, false, fmt.Errorf("storenode: read %s: %w", name, err)
	}
	m, err = decodeMeta(b)
	if err != nil {
		return nil, false, fmt.Errorf("storenode: %s: %w", name, err)
	}
	if m.version >= metaVersion {
		if _, err := loadMapLog(fs, dir, m, offsets); err != nil {
			return nil, false, err
		}
	}
	return m, true, nil
}

// metaBytesMax bounds a meta file's size before it is read.
const metaBytesMax = 1 << 40

// metaStreamBytes is the size above which loadMeta checks a meta file's magic, version and
// checksum by streaming it (metaStreamChunk at a time) before it reads the file into memory: a
// damaged (or sparse) file then costs no allocation of its size.
const (
	metaStreamBytes = 1 << 20
	metaStreamChunk = 1 << 20
)

// precheckMeta checks the magic, checksum and version of the meta file f of size bytes
// (> metaStreamBytes) with decodeMeta's errors, reading it metaStreamChunk at a time.
func precheckMeta(f vfs.File, size int64) error {
	read := func(b []byte, off int64) error {
		n, err := f.ReadAt(b, off)
		if n == len(b) {
			return nil
		}
		if err == nil || errors.Is(err, io.EOF) {
			return corrupt.Errorf("storenode: meta: %d bytes read at %d of %d: the file shrank", n, off, size)
		}
		return fmt.Errorf("storenode: read meta at %d: %w", off, err)
	}
	buf := make([]byte, metaStreamChunk)
	hdr := buf[:metaHeaderBytes]
	if err := read(hdr, 0); err != nil {
		return err
	}
	if string(hdr[:8]) != metaMagic {
		return corrupt.Errorf("storenode: meta: bad magic %q", hdr[:8])
	}
	version := binary.LittleEndian.Uint32(hdr[8:])
	body := size - metaTrailerBytes
	var crc uint32
	for off := int64(0); off < body; {
		b := buf[:min(int64(len(buf)), body-off)]
		if err := read(b, off); err != nil {
			return err
		}
		if off == 0 {
			crc = checksum.Of(b)
		} else {
			crc = checksum.Update(crc, b)
		}
		off += int64(len(b))
	}
	tr := buf[:metaTrailerBytes]
	if err := read(tr, body); err != nil {
		return err
	}
	if want := binary.LittleEndian.Uint32(tr); crc != want {
		return corrupt.Errorf("storenode: meta: offset %d: checksum %#08x stored, %#08x computed over bytes [0, %d)",
			body, want, crc, body)
	}
	if version < metaVersionDense { // after the checksum, as decodeMeta: a damaged file is not an old one
		return fmt.Errorf("%w: meta file format version %d, this build reads versions %d to %d only "+
			"(open the store with the build that wrote it and export its rows)", ErrOldFormat, version, metaVersionDense, metaVersion)
	}
	return nil
}

func pad8(n int) int { return (n + 7) &^ 7 }

func sortedOwners(m map[uint64]ownerState) []uint64 {
	ids := slices.Collect(maps.Keys(m))
	slices.Sort(ids)
	return ids
}

func sortedTableIDs(m map[uint32]*table) []uint32 {
	ids := slices.Collect(maps.Keys(m))
	slices.Sort(ids)
	return ids
}
