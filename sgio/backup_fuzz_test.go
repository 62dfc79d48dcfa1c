package sgio

import (
	"testing"
)

// FuzzBackupMessages parses arbitrary bodies as Backup and BackupChunk: no panic, every
// failure malformed, every accepted body re-encodes to itself, and an accepted chunk's data
// lies inside the body (aliasing it, nothing allocated) within BackupChunkMax.
func FuzzBackupMessages(f *testing.F) {
	f.Add(uint8(TypeBackup), (&Backup{Stream: 3, ChunkMax: 4096}).AppendBody(nil))
	for _, m := range []*BackupChunk{
		{Stream: 1, Kind: BackupKindMeta, Data: []byte("0123456789")},
		{Stream: 1, Kind: BackupKindData, Num: 2, Offset: 4096, Data: make([]byte, 4096)},
		{Stream: 1, Kind: BackupKindWAL, Num: 17, Data: []byte{}},
		{Stream: 1, Kind: BackupKindEnd, Num: 5, Offset: 9, Data: []byte{}},
	} {
		f.Add(uint8(TypeBackupChunk), m.AppendBody(nil))
	}
	// A length far beyond the body and beyond the limit.
	f.Add(uint8(TypeBackupChunk), []byte{1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
		1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, typ uint8, body []byte) {
		tt := TypeBackupChunk
		if typ%2 == 0 {
			tt = TypeBackup
		}
		checkBody(t, tt, body)
		if tt == TypeBackupChunk {
			var m BackupChunk
			if m.Parse(body) == nil {
				if len(m.Data) > BackupChunkMax || len(m.Data) > 0 && &m.Data[0] != &body[32] {
					t.Fatalf("chunk data of %d bytes does not alias the body", len(m.Data))
				}
			}
		}
	})
}
