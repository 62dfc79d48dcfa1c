package storenode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"path"
	"strconv"
	"strings"

	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
)

// The map log (meta version 4). Every table's page map lives in one append-only file,
// maplog-<generation as 16 hex digits>, so a checkpoint writes only the leaves it changed.
// All integers little-endian.
//
//	header, 16 bytes: magic "WEFTMLOG" 8 | generation u64 (= the name's)
//	record, 32 + 24*popcount(set) bytes:
//	  table id u32 | leaf index u32 (= logical page / 64) | set mask u64 | clear mask u64 |
//	  popcount(set) page-map entries (meta.go's 24-byte entry, never all zero), in slot order |
//	  crc32c u32 over the record before it | reserved u32 (0)
//
// A record changes one leaf of one table: bit s of set puts the next entry at page 64*leaf+s,
// bit s of clear removes that page's entry (which must exist); the masks are disjoint and not
// both zero. Records apply in file order. A record of a table the meta file does not list is
// of a dropped table and is skipped (table ids are never reused). A checkpoint appends one
// record per leaf whose entries it changed, holding only the changed entries; a compacted log
// holds one record per leaf, its entries all set.
//
// The meta file (version 4) names the generation and the published length; it stays the one
// commit point: a checkpoint appends the changed leaves at the published length, fsyncs the
// log, then publishes the meta file. Bytes beyond the published length are a checkpoint that
// was not published: ignored, and truncated by Open. When the log would grow beyond twice its
// live bytes plus mapLogSlack (or the loaded meta file was version 2 or 3, or there is no log
// yet), the checkpoint writes every live leaf into a fresh log of the next generation
// instead (fsync, fsync the directory), publishes the meta file naming it, then removes the
// old log; Open removes any map log the meta file does not name (a compaction not published,
// or an old log not yet removed).
const (
	mapLogMagic       = "WEFTMLOG"
	mapLogHeaderBytes = 16
	mapLogRecordBytes = 32 // a record without its entries
	mapLogPrefix      = "maplog-"
	// mapLogSlack is the dead bytes a log may always hold before a checkpoint compacts it.
	mapLogSlack = 256 << 10
)

func mapLogName(gen uint64) string { return fmt.Sprintf("%s%016x", mapLogPrefix, gen) }

// parseMapLogName returns the generation of a map log's file name.
func parseMapLogName(n string) (uint64, bool) {
	hex, ok := strings.CutPrefix(n, mapLogPrefix)
	if !ok || len(hex) != 16 {
		return 0, false
	}
	gen, err := strconv.ParseUint(hex, 16, 64)
	return gen, err == nil && gen != 0
}

func appendMapLogHeader(b []byte, gen uint64) []byte {
	b = append(b, mapLogMagic...)
	return binary.LittleEndian.AppendUint64(b, gen)
}

func appendMapLogRecord(b []byte, table uint32, leaf, set, clear uint64, ents []mapEntry) []byte {
	start := len(b)
	b = binary.LittleEndian.AppendUint32(b, table)
	b = binary.LittleEndian.AppendUint32(b, uint32(leaf))
	b = binary.LittleEndian.AppendUint64(b, set)
	b = binary.LittleEndian.AppendUint64(b, clear)
	for _, e := range ents {
		b = binary.LittleEndian.AppendUint32(b, e.disk)
		b = binary.LittleEndian.AppendUint32(b, e.crc)
		b = binary.LittleEndian.AppendUint64(b, e.lsn)
		b = binary.LittleEndian.AppendUint64(b, e.present)
	}
	b = binary.LittleEndian.AppendUint32(b, checksum.Of(b[start:]))
	return binary.LittleEndian.AppendUint32(b, 0)
}

// mapLogLiveBytes returns the bytes a compacted log of m's maps holds.
func mapLogLiveBytes(m *metaState) int64 {
	n := int64(mapLogHeaderBytes)
	for i := range m.tables {
		n += int64(m.tables[i].pages.leafCount())*mapLogRecordBytes + int64(m.tables[i].pages.count())*metaEntryBytes
	}
	return n
}

// encodeMapLog returns a compacted log of generation gen holding every leaf of m's maps.
func encodeMapLog(m *metaState, gen uint64) []byte {
	b := appendMapLogHeader(make([]byte, 0, mapLogLiveBytes(m)), gen)
	for i := range m.tables {
		t := &m.tables[i]
		t.pages.eachLeaf(func(leaf, mask uint64, ents []mapEntry) bool {
			b = appendMapLogRecord(b, t.id, leaf, mask, 0, ents)
			return true
		})
	}
	return b
}

// appendMapLogDiff appends a record for every leaf of m's maps whose entries differ from the
// map of the same table in logged (nil: none), holding only the changed entries. Shared
// subtrees are skipped, so the cost is the changed paths', not the maps'.
func appendMapLogDiff(b []byte, m *metaState, logged map[uint32]*pageMap) []byte {
	var ents []mapEntry
	for i := range m.tables {
		t := &m.tables[i]
		pmDiff(logged[t.id], t.pages, func(leaf uint64, a, n *pmNode) {
			var ma, mb uint64
			if a != nil {
				ma = a.mask
			}
			if n != nil {
				mb = n.mask
			}
			var set uint64
			ents = ents[:0]
			for mask := mb; mask != 0; mask &= mask - 1 {
				slot := uint64(bits.TrailingZeros64(mask))
				ent := n.ents[bits.OnesCount64(mb&(1<<slot-1))]
				if ma&(1<<slot) != 0 && a.ents[bits.OnesCount64(ma&(1<<slot-1))] == ent {
					continue
				}
				set |= 1 << slot
				ents = append(ents, ent)
			}
			if clear := ma &^ mb; set|clear != 0 {
				b = appendMapLogRecord(b, t.id, leaf, set, clear, ents)
			}
		})
	}
	return b
}

// pmDiff calls fn for every leaf whose node differs between a and b (by identity: a leaf
// copied but unchanged is reported too), with a's and b's leaf (nil when one has none).
func pmDiff(a, b *pageMap, fn func(leaf uint64, a, b *pmNode)) {
	h := 0
	if a != nil && a.root != nil {
		h = int(a.height)
	}
	if b != nil && b.root != nil {
		h = max(h, int(b.height))
	}
	pmDiffNode(pmLift(a, h), pmLift(b, h), h, 0, fn)
}

// pmLift returns m's root as a node of level h >= its height (wrapping it in slot 0).
func pmLift(m *pageMap, h int) *pmNode {
	if m == nil || m.root == nil {
		return nil
	}
	n := m.root
	for l := int(m.height); l < h; l++ {
		n = &pmNode{mask: 1, kids: []*pmNode{n}}
	}
	return n
}

func pmDiffNode(a, b *pmNode, level int, base uint64, fn func(leaf uint64, a, b *pmNode)) {
	if a == b {
		return
	}
	if level == 0 {
		fn(base, a, b)
		return
	}
	var ma, mb uint64
	if a != nil {
		ma = a.mask
	}
	if b != nil {
		mb = b.mask
	}
	for mask := ma | mb; mask != 0; mask &= mask - 1 {
		slot := uint64(bits.TrailingZeros64(mask))
		var ka, kb *pmNode
		if ma&(1<<slot) != 0 {
			ka = a.kids[bits.OnesCount64(ma&(1<<slot-1))]
		}
		if mb&(1<<slot) != 0 {
			kb = b.kids[bits.OnesCount64(mb&(1<<slot-1))]
		}
		pmDiffNode(ka, kb, level-1, base<<6|slot, fn)
	}
}

// decodeMapLog decodes the map log b of generation gen (its published length) into the page
// maps of m's tables (decodeMeta of a version-4 file left them nil, with the counts the meta
// file holds). With offsets it records, per table, the offset of each entry's bytes in the
// last record that set it (Check's finding offsets: memory per entry, so Check only).
func decodeMapLog(b []byte, gen uint64, m *metaState, offsets bool) error {
	if err := applyMapLog(b, gen, m, offsets); err != nil {
		return err
	}
	for i := range m.tables {
		t := &m.tables[i]
		if uint64(t.pages.leafCount()) != t.wantLeaves || uint64(t.pages.count()) != t.wantEntries {
			return mapLogBad(-1, "table %d: %d leaves and %d entries, the meta file says %d and %d",
				t.id, t.pages.leafCount(), t.pages.count(), t.wantLeaves, t.wantEntries)
		}
	}
	return nil
}

// applyMapLog is decodeMapLog without the check of the counts.
func applyMapLog(b []byte, gen uint64, m *metaState, offsets bool) error {
	if len(b) < mapLogHeaderBytes || string(b[:8]) != mapLogMagic || binary.LittleEndian.Uint64(b[8:]) != gen {
		return mapLogBad(0, "bad header")
	}
	byID := make(map[uint32]*metaTable, len(m.tables))
	edits := make(map[uint32]*pageMap, len(m.tables))
	for i := range m.tables {
		t := &m.tables[i]
		byID[t.id] = t
		edits[t.id] = (*pageMap)(nil).edit()
		t.logFile = mapLogName(gen)
		if offsets {
			t.entryOff = make(map[uint64]int64)
		}
	}
	for off := mapLogHeaderBytes; off < len(b); {
		p := b[off:]
		if len(p) < mapLogRecordBytes {
			return mapLogBad(off, "truncated record")
		}
		id := binary.LittleEndian.Uint32(p)
		leaf := uint64(binary.LittleEndian.Uint32(p[4:]))
		set, clear := binary.LittleEndian.Uint64(p[8:]), binary.LittleEndian.Uint64(p[16:])
		size := mapLogRecordBytes + bits.OnesCount64(set)*metaEntryBytes
		if len(p) < size {
			return mapLogBad(off, "record of %d bytes in %d", size, len(p))
		}
		if got, want := checksum.Of(p[:size-8]), binary.LittleEndian.Uint32(p[size-8:]); got != want {
			return mapLogBad(off, "checksum %#08x stored, %#08x computed", want, got)
		}
		if binary.LittleEndian.Uint32(p[size-4:]) != 0 || id == 0 || id >= m.nextTable ||
			leaf >= tablePagesMax/logicpage.RowsPerPage || set&clear != 0 || set|clear == 0 {
			return mapLogBad(off, "bad record (table %d, leaf %d, set %#x, clear %#x)", id, leaf, set, clear)
		}
		if pm, ok := edits[id]; ok {
			t := byID[id]
			first := leaf * logicpage.RowsPerPage
			for mask := clear; mask != 0; mask &= mask - 1 {
				page := first + uint64(bits.TrailingZeros64(mask))
				if pm.get(page) == (mapEntry{}) {
					return mapLogBad(off, "clears page %d of table %d, which has no entry", page, id)
				}
				pm.set(page, mapEntry{})
				if offsets {
					delete(t.entryOff, page)
				}
			}
			e := p[mapLogRecordBytes-8 : size-8]
			for mask := set; mask != 0; mask &= mask - 1 {
				ent := mapEntry{
					disk:    binary.LittleEndian.Uint32(e),
					crc:     binary.LittleEndian.Uint32(e[4:]),
					lsn:     binary.LittleEndian.Uint64(e[8:]),
					present: binary.LittleEndian.Uint64(e[16:]),
				}
				if ent == (mapEntry{}) {
					return mapLogBad(off, "an empty entry")
				}
				page := first + uint64(bits.TrailingZeros64(mask))
				pm.set(page, ent)
				if offsets {
					t.entryOff[page] = int64(off + size - 8 - len(e))
				}
				e = e[metaEntryBytes:]
			}
		}
		off += size
	}
	for id, pm := range edits {
		byID[id].pages = pm.seal()
	}
	return nil
}

// mapLogDamage is a damaged map log: Check reports its file and offset.
type mapLogDamage struct {
	file string // relative to the store's directory
	off  int64  // of the damaged record, -1 when none
	err  error  // wraps corrupt.ErrCorruption
}

func (d *mapLogDamage) Error() string { return d.err.Error() }
func (d *mapLogDamage) Unwrap() error { return d.err }

func mapLogBad(off int, format string, args ...any) error {
	if off >= 0 {
		format, args = "offset %d: "+format, append([]any{off}, args...)
	}
	return &mapLogDamage{off: int64(off), err: corrupt.Errorf("storenode: map log: "+format, args...)}
}

// loadMapLog reads the map log m names through its published length, decodes it into m
// (offsets: decodeMapLog's) and returns its bytes (nil when m names none).
func loadMapLog(fs vfs.FS, dir string, m *metaState, offsets bool) ([]byte, error) {
	if m.logGen == 0 {
		for i := range m.tables {
			t := &m.tables[i]
			if t.wantLeaves != 0 || t.wantEntries != 0 {
				return nil, corrupt.Errorf("storenode: meta: table %d has %d entries but there is no map log", t.id, t.wantEntries)
			}
		}
		return nil, nil
	}
	name := path.Join(dir, mapLogName(m.logGen))
	f, err := fs.Open(name)
	if err != nil {
		if isNotExist(err) {
			return nil, &mapLogDamage{file: mapLogName(m.logGen), off: -1,
				err: corrupt.Errorf("storenode: %s: the map log the meta file names is missing", name)}
		}
		return nil, fmt.Errorf("storenode: open %s: %w", name, err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return nil, fmt.Errorf("storenode: size of %s: %w", name, err)
	}
	if size < int64(m.logLen) {
		return nil, &mapLogDamage{file: mapLogName(m.logGen), off: -1,
			err: corrupt.Errorf("storenode: %s: %d bytes, the meta file published %d", name, size, m.logLen)}
	}
	if m.logLen > mapLogStreamBytes {
		if err := precheckMapLog(f, m.logGen, int64(m.logLen), mapLogStreamChunk); err != nil {
			var d *mapLogDamage
			if errors.As(err, &d) {
				d.file = mapLogName(m.logGen)
				d.err = fmt.Errorf("storenode: %s: %w", name, d.err)
				return nil, d
			}
			return nil, fmt.Errorf("storenode: %s: %w", name, err)
		}
	}
	b := make([]byte, m.logLen) // bounded by the file's size, and (precheckMapLog) by its valid records
	if _, err := f.ReadAt(b, 0); err != nil {
		return nil, fmt.Errorf("storenode: read %s: %w", name, err)
	}
	if err := decodeMapLog(b, m.logGen, m, offsets); err != nil {
		var d *mapLogDamage
		if errors.As(err, &d) {
			d.file = mapLogName(m.logGen)
			d.err = fmt.Errorf("storenode: %s: %w", name, d.err)
			return nil, d
		}
		return nil, fmt.Errorf("storenode: %s: %w", name, err)
	}
	return b, nil
}

// mapLogStreamBytes is the published length above which loadMapLog checks the map log's
// header and every record's size and checksum by streaming it (mapLogStreamChunk at a time)
// before it reads the log into memory: a sparse or damaged log (a file of 1 TiB that is one
// hole, named by a meta file of a crafted or damaged backup) then costs no allocation of its
// length, only of the valid records it really holds.
const (
	mapLogStreamBytes = 1 << 20
	mapLogStreamChunk = 1 << 20
)

// mapLogRecordBytesMax is the largest record: one that sets a whole leaf.
const mapLogRecordBytesMax = mapLogRecordBytes + logicpage.RowsPerPage*metaEntryBytes

// precheckMapLog checks the header of the map log f of generation gen and the size and
// checksum of every record through length, reading it chunk bytes (>= mapLogRecordBytesMax)
// at a time, with applyMapLog's errors and offsets.
func precheckMapLog(f vfs.File, gen uint64, length int64, chunk int) error {
	buf := make([]byte, chunk)
	var have []byte                  // the bytes read but not checked yet, from file offset base
	base, next := int64(0), int64(0) // next: the file offset of the next read
	fill := func() error {
		n := copy(buf, have)
		want := int(min(int64(len(buf)-n), length-next))
		k, err := f.ReadAt(buf[n:n+want], next)
		if k != want {
			if err == nil || errors.Is(err, io.EOF) {
				return mapLogBad(-1, "%d bytes read at %d of %d: the file shrank", k, next, length)
			}
			return fmt.Errorf("read map log at %d: %w", next, err)
		}
		next += int64(want)
		have = buf[:n+want]
		return nil
	}
	if err := fill(); err != nil {
		return err
	}
	if len(have) < mapLogHeaderBytes || string(have[:8]) != mapLogMagic || binary.LittleEndian.Uint64(have[8:]) != gen {
		return mapLogBad(0, "bad header")
	}
	have, base = have[mapLogHeaderBytes:], mapLogHeaderBytes
	for base < length {
		if len(have) < mapLogRecordBytesMax && next < length {
			if err := fill(); err != nil {
				return err
			}
		}
		p := have
		if len(p) < mapLogRecordBytes {
			return mapLogBad(int(base), "truncated record")
		}
		size := mapLogRecordBytes + bits.OnesCount64(binary.LittleEndian.Uint64(p[8:]))*metaEntryBytes
		if len(p) < size {
			return mapLogBad(int(base), "record of %d bytes in %d", size, len(p))
		}
		if got, want := checksum.Of(p[:size-8]), binary.LittleEndian.Uint32(p[size-8:]); got != want {
			return mapLogBad(int(base), "checksum %#08x stored, %#08x computed", want, got)
		}
		have, base = have[size:], base+int64(size)
	}
	return nil
}

// mapLogState is the engine's view of the published map log. Changed only by checkpoints
// (under ckptMu) and Open.
type mapLogState struct {
	gen    uint64
	length int64
	logged map[uint32]*pageMap // each table's map as the published log holds it
	full   bool                // the next checkpoint writes a fresh log (a version 2 or 3 meta was loaded)
}

// writeMapLog writes snap's new page maps to the map log before snap is published: the changed
// leaves appended at the published length, or a fresh compacted log of the next generation.
// It sets snap's log generation and length and returns the log to remove after the publish
// (0: none). No lock held: the maps are sealed.
func (e *Engine) writeMapLog(snap *metaState) (old uint64, err error) {
	s := &e.mlog
	live := mapLogLiveBytes(snap)
	var rec []byte
	compact := s.full || s.gen == 0
	if !compact {
		rec = appendMapLogDiff(nil, snap, s.logged)
		compact = s.length+int64(len(rec)) > 2*live+e.logSlack
	}
	if compact && s.gen == 0 && live == mapLogHeaderBytes {
		snap.logGen, snap.logLen = 0, 0 // nothing mapped: no log yet
		return 0, nil
	}
	if !compact {
		snap.logGen, snap.logLen = s.gen, uint64(s.length+int64(len(rec)))
		if len(rec) == 0 {
			return 0, nil
		}
		name := path.Join(e.dir, mapLogName(s.gen))
		f, err := e.fs.Open(name)
		if err != nil {
			return 0, fmt.Errorf("storenode: checkpoint: %w", err)
		}
		defer f.Close()
		if _, err := f.WriteAt(rec, s.length); err != nil {
			return 0, fmt.Errorf("storenode: checkpoint: append to %s: %w", name, err)
		}
		if err := f.Sync(); err != nil {
			return 0, fmt.Errorf("storenode: checkpoint: sync %s: %w", name, err)
		}
		e.stats.mapLogBytes.Add(uint64(len(rec)))
		e.stats.mapLogAppends.Add(1)
		return 0, nil
	}
	gen := s.gen + 1
	b := encodeMapLog(snap, gen)
	name := path.Join(e.dir, mapLogName(gen))
	f, err := e.fs.Create(name)
	if err != nil {
		return 0, fmt.Errorf("storenode: checkpoint: %w", err)
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		f.Close()
		return 0, fmt.Errorf("storenode: checkpoint: write %s: %w", name, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return 0, fmt.Errorf("storenode: checkpoint: sync %s: %w", name, err)
	}
	if err := f.Close(); err != nil {
		return 0, fmt.Errorf("storenode: checkpoint: close %s: %w", name, err)
	}
	if err := e.fs.SyncDir(e.dir); err != nil {
		return 0, fmt.Errorf("storenode: checkpoint: sync dir: %w", err)
	}
	e.stats.mapLogBytes.Add(uint64(len(b)))
	e.stats.mapLogCompactions.Add(1)
	snap.logGen, snap.logLen = gen, uint64(len(b))
	return s.gen, nil
}

// publishedMapLog records snap's map log as published and removes the old log (0: none). A
// failed remove is logged: Open removes a map log the meta file does not name.
func (e *Engine) publishedMapLog(snap *metaState, old uint64) {
	s := &e.mlog
	s.gen, s.length, s.full = snap.logGen, int64(snap.logLen), false
	s.logged = make(map[uint32]*pageMap, len(snap.tables))
	for i := range snap.tables {
		s.logged[snap.tables[i].id] = snap.tables[i].pages
	}
	if old != 0 {
		if err := e.fs.Remove(path.Join(e.dir, mapLogName(old))); err != nil && !isNotExist(err) {
			e.opts.Logger.Warn("storenode: remove old map log", "gen", old, "err", err)
		}
	}
}

// openMapLog sets the engine's map log state from the loaded meta m, truncates the log to
// its published length (a checkpoint's append that was not published) and removes every map
// log m does not name. Called by Open, after loadMeta.
func (e *Engine) openMapLog(m *metaState) error {
	e.mlog = mapLogState{gen: m.logGen, length: int64(m.logLen), full: m.version < metaVersion,
		logged: make(map[uint32]*pageMap, len(m.tables))}
	for i := range m.tables {
		e.mlog.logged[m.tables[i].id] = m.tables[i].pages
	}
	names, err := e.fs.List(e.dir)
	if err != nil {
		return fmt.Errorf("storenode: list %s: %w", e.dir, err)
	}
	for _, n := range names {
		gen, ok := parseMapLogName(n)
		if !ok {
			continue
		}
		name := path.Join(e.dir, n)
		if gen != m.logGen {
			if err := e.fs.Remove(name); err != nil {
				return fmt.Errorf("storenode: remove unpublished map log %s: %w", name, err)
			}
			continue
		}
		f, err := e.fs.Open(name)
		if err != nil {
			return fmt.Errorf("storenode: open %s: %w", name, err)
		}
		size, err := f.Size()
		if err == nil && size > int64(m.logLen) {
			if err = f.Truncate(int64(m.logLen)); err == nil {
				err = f.Sync()
			}
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("storenode: truncate %s to its published length: %w", name, err)
		}
	}
	return nil
}
