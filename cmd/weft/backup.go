package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// cmdBackup copies a running storage node into a new directory (weft --store ADDR backup
// --out DIR): a checkpoint-consistent snapshot plus the WAL tail it needs, pulled one piece
// at a time, while the node goes on committing. With --dir it backs up a stopped store,
// opened in this process. A storage node, or an embedded txnode.Open,
// starts on the directory; its first start bumps every table's epoch (see docs/operations.md).
func cmdBackup(ctx context.Context, g *globals, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("backup", flag.ContinueOnError)
	out := fs.String("out", "", "the new directory to write the backup into (must not exist, or be empty)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) != 0:
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, pos)
	case *out == "":
		return fmt.Errorf("%w: say where to write the backup: --out DIR", errUsage)
	case g.dir != "" && g.store != "":
		return fmt.Errorf("%w: --store and --dir are exclusive", errUsage)
	case g.dir != "":
		// A stopped store: opened here, backed up like a running one, so the copy is marked
		// RESTORED too (a plain cp -r of the directory is not: restored, it would take the
		// grants of the transaction nodes that owned its tables after the copy).
		return backupLocal(ctx, g.dir, *out, stdout)
	case g.store == "":
		return fmt.Errorf("%w: say which storage node to back up: --store ADDR (or $WEFT_STORE), or a stopped store's --dir DIR", errUsage)
	}
	secret, err := g.secret()
	if err != nil {
		return err
	}
	c, err := sgio.Dial(ctx, sgio.ClientConfig{Addr: g.store, Secret: secret, Name: "weft-backup",
		MaxBody: sgio.BackupChunkMax + 64})
	if err != nil {
		return fmt.Errorf("connect to %s: %w", g.store, err)
	}
	defer c.Close()
	d, err := storenode.NewBackupDir(nil, *out)
	if err != nil {
		return err
	}
	defer d.Close()
	start := time.Now()
	info, err := pullBackup(ctx, c, d)
	if err != nil {
		return fmt.Errorf("%w (%s is incomplete: remove it)", err, *out)
	}
	if err := d.Finish(info); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "backup of %s in %s: %d files, %d bytes, checkpoint LSN %d, WAL through LSN %d, in %v\n",
		g.store, *out, info.Files, info.Bytes, info.CheckpointLSN, info.ThroughLSN, time.Since(start).Round(time.Millisecond))
	return nil
}

// backupLocal backs up the stopped store in dir (opened in this process, so it fails while
// a storage node or game server has it open) into the new directory out.
func backupLocal(ctx context.Context, dir, out string, stdout io.Writer) error {
	src, err := openLocalSource(dir)
	if err != nil {
		return err
	}
	defer src.e.Close()
	d, err := storenode.NewBackupDir(nil, out)
	if err != nil {
		return err
	}
	defer d.Close()
	start := time.Now()
	info, err := src.e.Backup(ctx, d)
	if err != nil {
		return fmt.Errorf("%w (%s is incomplete: remove it)", err, out)
	}
	if err := d.Finish(info); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "backup of %s in %s: %d files, %d bytes, checkpoint LSN %d, WAL through LSN %d, in %v\n",
		dir, out, info.Files, info.Bytes, info.CheckpointLSN, info.ThroughLSN, time.Since(start).Round(time.Millisecond))
	return src.e.Close()
}

// pullBackup asks the storage node for its backup one piece at a time and writes each into d.
func pullBackup(ctx context.Context, c *sgio.Client, d *storenode.BackupDir) (storenode.BackupInfo, error) {
	var info storenode.BackupInfo
	var chunk sgio.BackupChunk
	var stream uint64
	last := storenode.BackupFile{}
	for {
		if err := c.CallInto(ctx, &sgio.Backup{Stream: stream, ChunkMax: sgio.BackupChunkMax}, &chunk); err != nil {
			return info, err
		}
		if stream != 0 && chunk.Stream != stream {
			return info, fmt.Errorf("backup: the storage node answered for stream %d, not %d: %w", chunk.Stream, stream, sgio.ErrMalformed)
		}
		stream = chunk.Stream
		if chunk.Kind == sgio.BackupKindEnd {
			info.CheckpointLSN, info.ThroughLSN = chunk.Num, chunk.Offset
			info.Bytes = d.Bytes()
			return info, nil
		}
		f := storenode.BackupFile{Kind: storenode.BackupFileKind(chunk.Kind), Num: chunk.Num}
		if f != last {
			info.Files++
			last = f
		}
		if err := d.WriteChunk(ctx, f, int64(chunk.Offset), chunk.Data); err != nil {
			return info, err
		}
	}
}
