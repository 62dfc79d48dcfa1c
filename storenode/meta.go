package storenode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"

	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
)

// The meta file is what a checkpoint publishes: the checkpoint LSN, the catalog, the ownership
// grants, the owners' last applied seqs (the dedup table) and every table's page map, in one
// checksummed file replaced atomically (write meta.tmp, fsync, rename to meta, fsync the
// directory). Recovery loads it, then replays the WAL after its LSN. All integers little-endian.
//
//	+---------------------------------------------------------------+
//	| magic "WEFTMETA" 8 | version u32 (2) | reserved u32            |  header, 48 bytes
//	| checkpoint LSN u64 | next table id u32 | table count u32       |
//	| owner count u32 | reserved u32 | synced LSN u64                |
//	+---------------------------------------------------------------+
//	| per table: id u32 | row bytes u16 | name len u16 | next id u64 |
//	|   holder u64 | epoch u64 | page count u64 | name, zero-padded   |
//	|   to 8 bytes | page count page-map entries                      |
//	| page-map entry (24 bytes): disk page+1 u32 (0: none) |          |
//	|   crc32c of the disk page u32 | page LSN u64 | present u64      |
//	+---------------------------------------------------------------+
//	| per owner (ascending id): owner u64 | last seq u64 |            |
//	|   last LSN u64 | window count u32 | reserved u32 |              |
//	|   window count entries, oldest first:                          |
//	|   seq u64 | LSN u64 | batch hash u64                           |
//	+---------------------------------------------------------------+
//	| crc32c u32 over everything before it | reserved u32            |
//	+---------------------------------------------------------------+
//
// The synced LSN is the WAL's synced-through LSN when the checkpoint was published (>= the
// checkpoint LSN): recovery treats a bad WAL record at or below it as corruption, never as a
// torn tail. A checkpoint taken inside replay publishes at least the synced LSN of the meta
// file recovery loaded (those records stay proved durable). The owner windows are the dedup table (owners.go); a window's seqs are
// consecutive and end at the owner's last seq. Version 1 (no windows, no batch hash in commit
// records) is refused with ErrOldFormat.
//
// The whole page map is rewritten by every checkpoint: 24 bytes a logical page (11 MiB for 30M
// rows of 64 bytes). See docs/storage.md for the cost and the incremental alternative.
//
// Part of the format; do not change.
const (
	metaMagic        = "WEFTMETA"
	metaVersion      = 2
	metaHeaderBytes  = 48
	metaTableBytes   = 40
	metaEntryBytes   = 24
	metaOwnerBytes   = 32
	metaDedupBytes   = 24
	metaTrailerBytes = 8
	metaName         = "meta"
	metaTempName     = "meta.tmp"
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
	pages    []mapEntry
}

type metaState struct {
	ckptLSN   uint64
	syncedLSN uint64
	nextTable uint32
	tables    []metaTable
	owners    map[uint64]ownerState
}

func encodeMeta(m *metaState) []byte {
	size := metaHeaderBytes + metaTrailerBytes
	for _, o := range m.owners {
		size += metaOwnerBytes + o.n*metaDedupBytes
	}
	for _, t := range m.tables {
		size += metaTableBytes + pad8(len(t.name)) + len(t.pages)*metaEntryBytes
	}
	b := make([]byte, 0, size)
	b = append(b, metaMagic...)
	b = binary.LittleEndian.AppendUint32(b, metaVersion)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, m.ckptLSN)
	b = binary.LittleEndian.AppendUint32(b, m.nextTable)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.tables)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.owners)))
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, m.syncedLSN)
	for _, t := range m.tables {
		b = binary.LittleEndian.AppendUint32(b, t.id)
		b = binary.LittleEndian.AppendUint16(b, uint16(t.rowBytes))
		b = binary.LittleEndian.AppendUint16(b, uint16(len(t.name)))
		b = binary.LittleEndian.AppendUint64(b, t.nextID)
		b = binary.LittleEndian.AppendUint64(b, t.holder)
		b = binary.LittleEndian.AppendUint64(b, t.epoch)
		b = binary.LittleEndian.AppendUint64(b, uint64(len(t.pages)))
		b = append(b, t.name...)
		b = append(b, make([]byte, pad8(len(t.name))-len(t.name))...)
		for _, e := range t.pages {
			b = binary.LittleEndian.AppendUint32(b, e.disk)
			b = binary.LittleEndian.AppendUint32(b, e.crc)
			b = binary.LittleEndian.AppendUint64(b, e.lsn)
			b = binary.LittleEndian.AppendUint64(b, e.present)
		}
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
	b = binary.LittleEndian.AppendUint32(b, checksum.Of(b))
	b = binary.LittleEndian.AppendUint32(b, 0)
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
	if v := binary.LittleEndian.Uint32(b[8:]); v != metaVersion {
		if v < metaVersion {
			return nil, fmt.Errorf("%w: meta file format version %d, this build reads version %d only "+
				"(open the store with the build that wrote it and export its rows)", ErrOldFormat, v, metaVersion)
		}
		return nil, corrupt.Errorf("storenode: meta: version %d, want %d", v, metaVersion)
	}
	m := &metaState{
		ckptLSN:   binary.LittleEndian.Uint64(b[16:]),
		syncedLSN: binary.LittleEndian.Uint64(b[40:]),
		nextTable: binary.LittleEndian.Uint32(b[24:]),
	}
	nTables := binary.LittleEndian.Uint32(b[28:])
	nOwners := binary.LittleEndian.Uint32(b[32:])
	if binary.LittleEndian.Uint32(b[12:]) != 0 || binary.LittleEndian.Uint32(b[36:]) != 0 || m.syncedLSN < m.ckptLSN {
		return nil, corrupt.Errorf("storenode: meta: bad header")
	}
	p := body[metaHeaderBytes:]
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
		nPages := binary.LittleEndian.Uint64(p[32:])
		p = p[metaTableBytes:]
		if pad8(nameLen) > len(p) || nPages > uint64(len(p)-pad8(nameLen))/metaEntryBytes {
			return nil, corrupt.Errorf("storenode: meta: table %d: name of %d bytes and %d pages in %d bytes",
				t.id, nameLen, nPages, len(p))
		}
		t.name = string(p[:nameLen])
		p = p[pad8(nameLen):]
		if _, err := logicpage.NewGeometry(t.rowBytes); err != nil || checkName(t.name) != nil || t.id == 0 ||
			t.id >= m.nextTable || seen[t.id] || nPages > tablePagesMax {
			return nil, corrupt.Errorf("storenode: meta: bad table %d %q row size %d", t.id, t.name, t.rowBytes)
		}
		seen[t.id] = true
		t.pages = make([]mapEntry, nPages)
		for i := range t.pages {
			t.pages[i] = mapEntry{
				disk:    binary.LittleEndian.Uint32(p),
				crc:     binary.LittleEndian.Uint32(p[4:]),
				lsn:     binary.LittleEndian.Uint64(p[8:]),
				present: binary.LittleEndian.Uint64(p[16:]),
			}
			p = p[metaEntryBytes:]
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
	if len(p) != 0 {
		return nil, corrupt.Errorf("storenode: meta: %d trailing bytes", len(p))
	}
	return m, nil
}

// publishMeta makes m the store's durable state: write a temporary file, fsync it, rename it
// over the meta file, fsync the directory. A crash at any point leaves the old meta or the new.
func publishMeta(fs vfs.FS, dir string, m *metaState) error {
	b := encodeMeta(m)
	tmp := path.Join(dir, metaTempName)
	f, err := fs.Create(tmp)
	if err != nil {
		return fmt.Errorf("storenode: publish checkpoint: %w", err)
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		f.Close()
		return fmt.Errorf("storenode: publish checkpoint: write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("storenode: publish checkpoint: sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("storenode: publish checkpoint: close %s: %w", tmp, err)
	}
	if err := fs.Rename(tmp, path.Join(dir, metaName)); err != nil {
		return fmt.Errorf("storenode: publish checkpoint: %w", err)
	}
	if err := fs.SyncDir(dir); err != nil {
		return fmt.Errorf("storenode: publish checkpoint: sync dir: %w", err)
	}
	return nil
}

// loadMeta reads the published meta; ok is false when there is none (a new store).
func loadMeta(fs vfs.FS, dir string) (m *metaState, ok bool, err error) {
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
	if version < metaVersion { // after the checksum, as decodeMeta: a damaged file is not an old one
		return fmt.Errorf("%w: meta file format version %d, this build reads version %d only "+
			"(open the store with the build that wrote it and export its rows)", ErrOldFormat, version, metaVersion)
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
