package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/weftdb/weft/bench"
)

// Redis through go-redis, on a redis-server this process starts on a free loopback port (AOF
// on, fsync always or never per --sync). The workers' commands are pipelined: a few
// pipeliner goroutines, each with its own connection, send whatever commands are queued in
// one round trip, as Weft batches many transactions' IO in one writev. Update is GET then SET:
// two round trips, not atomic (two workers updating one key at once can lose an increment).
// Ids come from an atomic counter in this process.

const (
	redisPipeliners   = 4
	redisPipelineMax  = 512
	redisReadyTimeout = 30 * time.Second
	redisStopTimeout  = time.Minute
)

var errRedisNotFound = errors.New("redis: row not found")

type redisOp uint8

const (
	redisGet redisOp = iota
	redisSet
	redisDel
)

// redisReq is one command waiting for a pipeline.
type redisReq struct {
	op   redisOp
	key  string
	val  []byte
	dst  []byte
	err  error
	done chan struct{} // cap 1
}

var redisReqs = sync.Pool{New: func() any { return &redisReq{done: make(chan struct{}, 1)} }}

type redisBackend struct {
	cmd    *exec.Cmd
	exited chan error
	dir    string
	addr   string
	client *redis.Client
	reqs   chan *redisReq
	wg     sync.WaitGroup
	next   atomic.Uint64
	bufs   sync.Pool // *[]byte rows for Update
}

func redisFactory() bench.Factory {
	return bench.Factory{
		Name: "redis",
		Note: "redis-server (AOF, appendfsync always|no per --sync) via go-redis, commands of all workers pipelined; " +
			"update = GET then SET, two round trips, NOT atomic; ids from a local counter",
		Open: openRedis,
	}
}

func openRedis(ctx context.Context, cfg bench.OpenConfig) (_ bench.Backend, err error) {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("%w: redis-server is not on PATH", bench.ErrSkip)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "peers-redis-*")
	if err != nil {
		return nil, err
	}
	fsync := "always"
	if cfg.Sync == "none" {
		fsync = "no"
	}
	r := &redisBackend{dir: dir, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), exited: make(chan error, 1)}
	r.cmd = exec.Command(path, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "yes", "--appendfsync", fsync, "--auto-aof-rewrite-percentage", "0",
		"--protected-mode", "no", "--daemonize", "no", "--loglevel", "notice", "--logfile", "")
	stdout, err := r.cmd.StdoutPipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := r.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	defer func() {
		if err != nil {
			r.cmd.Process.Kill()
			<-r.exited
			os.RemoveAll(dir)
		}
	}()
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "Ready to accept connections") {
				close(ready)
				break
			}
		}
		io.Copy(io.Discard, stdout)
		r.exited <- r.cmd.Wait()
	}()
	t := time.NewTimer(redisReadyTimeout)
	defer t.Stop()
	select {
	case <-ready:
	case <-t.C:
		return nil, fmt.Errorf("redis-server not ready within %v", redisReadyTimeout)
	case err := <-r.exited:
		r.exited <- err
		return nil, fmt.Errorf("redis-server exited: %v", err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	r.client = redis.NewClient(&redis.Options{Addr: r.addr, PoolSize: redisPipeliners + 8, DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	if err := r.client.Ping(ctx).Err(); err != nil {
		r.client.Close()
		return nil, err
	}
	r.reqs = make(chan *redisReq, 4*redisPipelineMax)
	for range redisPipeliners {
		r.wg.Add(1)
		go r.pipeliner()
	}
	r.bufs.New = func() any { b := make([]byte, cfg.RowBytes); return &b }
	return r, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func redisKey(id uint64) string { return string(keyOf(id)) }

// pipeliner sends queued commands, as many as are waiting (up to redisPipelineMax), in one
// pipeline.
func (r *redisBackend) pipeliner() {
	defer r.wg.Done()
	ctx := context.Background()
	batch := make([]*redisReq, 0, redisPipelineMax)
	cmds := make([]redis.Cmder, 0, redisPipelineMax)
	for req := range r.reqs {
		batch = append(batch[:0], req)
	drain:
		for len(batch) < redisPipelineMax {
			select {
			case req, ok := <-r.reqs:
				if !ok {
					break drain
				}
				batch = append(batch, req)
			default:
				break drain
			}
		}
		pipe := r.client.Pipeline()
		cmds = cmds[:0]
		for _, q := range batch {
			switch q.op {
			case redisGet:
				cmds = append(cmds, pipe.Get(ctx, q.key))
			case redisSet:
				cmds = append(cmds, pipe.Set(ctx, q.key, q.val, 0))
			case redisDel:
				cmds = append(cmds, pipe.Del(ctx, q.key))
			}
		}
		pipe.Exec(ctx) // errors are per command
		for i, q := range batch {
			switch c := cmds[i].(type) {
			case *redis.StringCmd:
				b, err := c.Bytes()
				if errors.Is(err, redis.Nil) {
					err = errRedisNotFound
				}
				if err == nil {
					copy(q.dst, b)
				}
				q.err = err
			case *redis.IntCmd:
				q.err = c.Err()
				if q.err == nil && c.Val() == 0 {
					q.err = errRedisNotFound
				}
			default:
				q.err = cmds[i].Err()
			}
			q.done <- struct{}{}
		}
	}
}

// do runs one command through a pipeline and waits for its reply.
func (r *redisBackend) do(op redisOp, id uint64, val, dst []byte) error {
	q := redisReqs.Get().(*redisReq)
	q.op, q.key, q.val, q.dst = op, redisKey(id), val, dst
	r.reqs <- q
	<-q.done
	err := q.err
	q.key, q.val, q.dst, q.err = "", nil, nil, nil
	redisReqs.Put(q)
	return err
}

func (r *redisBackend) Load(ctx context.Context, spec bench.LoadSpec) (uint64, error) {
	r.next.Store(uint64(spec.Records))
	return 0, loadParallel(ctx, spec, 0, func(ids []uint64, rows [][]byte) error {
		_, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range ids {
				p.Set(ctx, redisKey(id), rows[i], 0)
			}
			return nil
		})
		return err
	})
}

func (r *redisBackend) Insert(_ context.Context, row []byte) (uint64, error) {
	id := r.next.Add(1) - 1
	return id, r.do(redisSet, id, row, nil)
}

func (r *redisBackend) Get(_ context.Context, id uint64, dst []byte) error {
	return r.do(redisGet, id, nil, dst)
}

func (r *redisBackend) Update(_ context.Context, id uint64, fn func([]byte) error) error {
	bp := r.bufs.Get().(*[]byte)
	defer r.bufs.Put(bp)
	row := *bp
	if err := r.do(redisGet, id, nil, row); err != nil {
		return err
	}
	if err := fn(row); err != nil {
		return err
	}
	return r.do(redisSet, id, row, nil)
}

func (r *redisBackend) Delete(_ context.Context, id uint64) error {
	return r.do(redisDel, id, nil, nil)
}

// Stats reads the TCP bytes to redis-server (first: the INFO request is then not counted by
// this snapshot) and the AOF's size.
func (r *redisBackend) Stats() bench.Stats {
	st := bench.Stats{NetBytes: bench.TCPBytes(r.addr), ServerCPU: bench.ProcessCPU(r.cmd.Process.Pid)}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := r.client.Info(ctx, "persistence").Result()
	if err == nil {
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "aof_current_size:"); ok {
				st.WALBytes, _ = strconv.ParseUint(v, 10, 64)
			}
		}
	}
	return st
}

// Close stops the pipeliners, the client and redis-server (SIGTERM: it syncs its AOF and
// exits), and removes its directory.
func (r *redisBackend) Close() error {
	close(r.reqs)
	r.wg.Wait()
	err := r.client.Close()
	if serr := r.cmd.Process.Signal(syscall.SIGTERM); serr != nil && !errors.Is(serr, os.ErrProcessDone) {
		err = errors.Join(err, serr)
	}
	t := time.NewTimer(redisStopTimeout)
	defer t.Stop()
	select {
	case werr := <-r.exited:
		err = errors.Join(err, werr)
	case <-t.C:
		r.cmd.Process.Kill()
		err = errors.Join(err, <-r.exited, errors.New("redis-server did not stop on SIGTERM"))
	}
	return errors.Join(err, os.RemoveAll(r.dir))
}
