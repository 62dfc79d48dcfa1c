package storenode

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"path"
	"slices"
	"strings"

	"github.com/weftdb/weft/bitmaptree"
	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
)

// Check of the page maps against the data files (see check.go).

// dupPagesListedMax bounds the logical pages a finding lists for one disk page mapped twice.
const dupPagesListedMax = 8

// metaEntryOffset returns the byte offset in the meta file of the page-map entry of page of
// the table whose entry starts at tableOff (the layout of meta.go, in the version read).
func metaEntryOffset(mt *metaTable, tableOff int64, page uint64) int64 {
	if mt.logFile != "" { // version 4: in the map log, in the last record that set it
		if off, ok := mt.entryOff[page]; ok {
			return off
		}
		return -1
	}
	start := tableOff + metaTableBytes + int64(pad8(len(mt.name)))
	if mt.densePages != 0 {
		return start + int64(page)*metaEntryBytes
	}
	leaves, entries := mt.pages.rank(page)
	return start + int64(leaves+1)*metaLeafBytes + int64(entries)*metaEntryBytes
}

// metaEntryFile returns the file that holds mt's page-map entries: the meta file, or (version
// 4) the map log.
func metaEntryFile(mt *metaTable) string {
	if mt.logFile != "" {
		return mt.logFile
	}
	return metaName
}

// metaPageMapBytes returns the bytes of mt's page map in the meta file, in the version read.
func metaPageMapBytes(mt *metaTable) int64 {
	if mt.logFile != "" {
		return 0
	}
	if mt.densePages != 0 {
		return int64(mt.densePages) * metaEntryBytes
	}
	return int64(mt.pages.leafCount())*metaLeafBytes + int64(mt.pages.count())*metaEntryBytes
}

// metaTableOffsets returns the byte offset in the meta file of each table's entry.
func metaTableOffsets(m *metaState) []int64 {
	offs := make([]int64, len(m.tables))
	off := int64(metaHeaderBytes)
	if m.version >= metaVersion {
		off = metaV4HeaderBytes
	}
	for i := range m.tables {
		offs[i] = off
		off += metaTableBytes + int64(pad8(len(m.tables[i].name))) + metaPageMapBytes(&m.tables[i])
	}
	return offs
}

// checkTable checks one table of the meta file: its page map, and every mapped disk page of
// its data file, read in disk order one page at a time. It returns only IO errors.
func (c *checker) checkTable(mt *metaTable, tableOff int64) error {
	geo, err := logicpage.NewGeometry(mt.rowBytes)
	if err != nil { // decodeMeta checked it
		return fmt.Errorf("storenode: check %s: table %d: %w", c.dir, mt.id, err)
	}
	pageBytes := int64(geo.DiskPageBytes())
	name := dataFileName(c.dir, mt.id)
	rel := path.Base(name)
	f, err := c.fs.Open(name)
	var size int64
	switch {
	case err == nil:
		defer f.Close()
		if size, err = f.Size(); err != nil {
			return fmt.Errorf("storenode: check %s: size of %s: %w", c.dir, name, err)
		}
	case isNotExist(err):
		f = nil
	default:
		return fmt.Errorf("storenode: check %s: open %s: %w", c.dir, name, err)
	}
	filePages := uint64(size / pageBytes)
	entry := func(page uint64) Finding {
		return Finding{File: metaEntryFile(mt), Offset: metaEntryOffset(mt, tableOff, page), Table: mt.id, Page: int64(page), DiskPage: -1}
	}

	used, dupSet := bitmaptree.New(), bitmaptree.New()
	var order []pageAt // logical pages whose disk page lies in the file, to read
	var dups []uint64  // disk pages mapped more than once
	var outside uint64 // distinct disk pages mapped beyond the file
	for page, ent := range mt.pages.all() {
		c.rep.Rows += uint64(bits.OnesCount64(ent.present))
		if ent.disk == 0 {
			if ent.present != 0 {
				fd := entry(page)
				fd.What = fmt.Sprintf("has rows (present mask %#016x) but no disk page (disk field 0): its rows have no durable copy", ent.present)
				c.damage(fd)
			}
			continue
		}
		d := uint64(ent.disk - 1)
		if used.Test(d) {
			if !dupSet.Test(d) {
				dupSet.Set(d)
				dups = append(dups, d)
			}
		} else {
			used.Set(d)
			if d >= filePages {
				outside++
			}
		}
		if d >= filePages {
			fd := entry(page)
			fd.DiskPage = int64(d)
			if f == nil {
				fd.What = fmt.Sprintf("maps disk page %d, but %s is missing", d, rel)
			} else {
				fd.What = fmt.Sprintf("maps disk page %d (bytes %d..%d of %s), beyond its end: the file holds %d bytes, %d whole disk pages of %d bytes",
					d, int64(d)*pageBytes, int64(d+1)*pageBytes, rel, size, filePages, pageBytes)
			}
			c.damage(fd)
			continue
		}
		order = append(order, pageAt{page, ent})
	}
	c.checkDups(mt, tableOff, dups)
	if f != nil {
		if err := c.checkDiskPages(mt, tableOff, f, rel, geo, order); err != nil {
			return err
		}
	}
	c.rep.DiskPages += filePages
	c.rep.FreeDiskPages += filePages - (used.Count() - outside)
	if rest := size % pageBytes; rest != 0 {
		c.note(Finding{File: rel, Offset: size - rest, Table: mt.id, Page: -1, DiskPage: int64(filePages),
			What: fmt.Sprintf("%d bytes after the last whole disk page (a checkpoint's write of a free page cut by a crash; a later checkpoint overwrites it)", rest)})
	}
	return nil
}

// checkDups reports each disk page that several logical pages map, listing them.
func (c *checker) checkDups(mt *metaTable, tableOff int64, dups []uint64) {
	if len(dups) == 0 {
		return
	}
	byDisk := make(map[uint64][]uint64, len(dups))
	for _, d := range dups {
		byDisk[d] = nil
	}
	for page, ent := range mt.pages.all() {
		if ent.disk == 0 {
			continue
		}
		if l, ok := byDisk[uint64(ent.disk-1)]; ok {
			byDisk[uint64(ent.disk-1)] = append(l, page)
		}
	}
	for _, d := range dups {
		pages := byDisk[d]
		list := make([]string, 0, min(len(pages), dupPagesListedMax))
		for _, p := range pages[:min(len(pages), dupPagesListedMax)] {
			list = append(list, fmt.Sprint(p))
		}
		more := ""
		if len(pages) > dupPagesListedMax {
			more = fmt.Sprintf(" and %d more", len(pages)-dupPagesListedMax)
		}
		c.damage(Finding{File: metaEntryFile(mt), Offset: metaEntryOffset(mt, tableOff, pages[1]), Table: mt.id, Page: int64(pages[1]),
			DiskPage: int64(d), What: fmt.Sprintf("disk page %d is mapped by logical pages %s%s: a disk page holds one logical page",
				d, strings.Join(list, ", "), more)})
	}
}

// checkDiskPages reads the disk pages of the logical pages in order (sorted here by disk
// page, so the file is read forwards) and checks each against its page-map entry: CRC32C,
// then zero bytes in every absent slot and in the padding after the rows.
func (c *checker) checkDiskPages(mt *metaTable, tableOff int64, f vfs.File, rel string, geo logicpage.Geometry, order []pageAt) error {
	slices.SortFunc(order, func(a, b pageAt) int { return cmp.Compare(a.ent.disk, b.ent.disk) })
	pageBytes := geo.DiskPageBytes()
	r := geo.RowBytes()
	buf := make([]byte, pageBytes)
	for i, pa := range order {
		if i%checkCtxEvery == 0 {
			if err := c.ctx.Err(); err != nil {
				return fmt.Errorf("storenode: check %s: %w", c.dir, err)
			}
		}
		p, ent := pa.page, pa.ent
		d := int64(ent.disk - 1)
		off := d * int64(pageBytes)
		fd := Finding{File: rel, Offset: off, Table: mt.id, Page: int64(p), DiskPage: d}
		n, err := f.ReadAt(buf, off)
		if n < len(buf) {
			if err != nil && !errors.Is(err, io.EOF) {
				return fmt.Errorf("storenode: check %s: read %s at %d: %w", c.dir, rel, off, err)
			}
			fd.What = fmt.Sprintf("read %d bytes of %d: the file shrank during the check", n, len(buf))
			c.damage(fd)
			continue
		}
		c.rep.Pages++
		if got := checksum.Of(buf); got != ent.crc {
			fd.What = fmt.Sprintf("checksum %#08x, the page-map entry (%s offset %d) says %#08x (page LSN %d)",
				got, metaEntryFile(mt), metaEntryOffset(mt, tableOff, p), ent.crc, ent.lsn)
			c.damage(fd)
			continue
		}
		absent := ^ent.present
		for m := absent; m != 0; m &= m - 1 {
			s := bits.TrailingZeros64(m)
			if !isZeroBytes(buf[s*r : (s+1)*r]) {
				fd.Offset = off + int64(s*r)
				fd.What = fmt.Sprintf("slot %d is absent (present mask %#016x) but its %d bytes are not zero (absent rows are zero)",
					s, ent.present, r)
				c.damage(fd)
				break
			}
		}
		if pad := buf[logicpage.RowsPerPage*r:]; !isZeroBytes(pad) {
			fd.Offset = off + int64(logicpage.RowsPerPage*r)
			fd.What = fmt.Sprintf("the %d bytes of padding after the rows are not zero", len(pad))
			c.damage(fd)
		}
	}
	return nil
}

// checkAfterWAL checks the page-map entries against the WAL, replayed into the catalog up to
// last, its last good record:
//   - no page LSN is after last: a checkpoint syncs the WAL through every record the pages
//     it writes hold, so those records had been durable;
//   - no page holds a row at or above its table's granted ids as of last. Not as of the meta
//     file's own next id: a checkpoint takes it when it starts, and a page it copies later
//     may hold rows of a grant logged after that (a grant is synced before its ids are used,
//     and the WAL through the page's LSN before the checkpoint publishes).
func (c *checker) checkAfterWAL(last uint64) {
	offs := metaTableOffsets(c.meta)
	for i := range c.meta.tables {
		mt := &c.meta.tables[i]
		nextID := mt.nextID
		if t := c.cat.tables[mt.id]; t != nil {
			nextID = max(nextID, t.nextID)
		}
		for page, ent := range mt.pages.all() {
			// Offset -1 until a damage is found: an entry's offset costs a rank query.
			fd := Finding{File: metaEntryFile(mt), Offset: -1, Table: mt.id, Page: int64(page), DiskPage: -1}
			if ent.disk != 0 {
				fd.DiskPage = int64(ent.disk - 1)
			}
			damage := func(fd Finding) {
				fd.Offset = metaEntryOffset(mt, offs[i], page)
				c.damage(fd)
			}
			if ent.disk != 0 && ent.lsn > last {
				fd.What = fmt.Sprintf("page LSN %d is after the WAL's last good record %d: the checkpoint synced the WAL through it, so records %d..%d are lost",
					ent.lsn, last, last+1, ent.lsn)
				damage(fd)
			}
			if ent.present == 0 {
				continue
			}
			if top := page*logicpage.RowsPerPage + uint64(63-bits.LeadingZeros64(ent.present)); top >= nextID {
				fd.What = fmt.Sprintf("holds row %d (present mask %#016x), at or above the table's granted ids (next id %d): a later grant would hand it out again",
					top, ent.present, nextID)
				damage(fd)
			}
		}
	}
}

// pageAt is a logical page and its page-map entry.
type pageAt struct {
	page uint64
	ent  mapEntry
}

func isZeroBytes(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}
