package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// The two-phase commit requests of a session (docs/cluster.md, "Two-phase commit").
// TxnPrepare is a commit batch with a header: the loop checks its body and its owner and its
// size against the queue's bounds before copying it (as a Commit), then a goroutine of its own
// hands it to Engine.PrepareTxn, which waits for the record's sync. TxnDecide, TxnApply,
// TxnAsk and TxnReport are small and run on the request goroutine (exec), never on the loop:
// the primary's lease check (the LeaseChecker, etcd) and the waits for syncs happen there,
// each bounded by txnRequestTimeout. Any authenticated session may send them (the resolvers
// of other storage nodes connect with owner 0), like the reads.

// txnRequestTimeout bounds the engine's work for one TxnDecide or TxnAsk (its lease check).
const txnRequestTimeout = 10 * time.Second

// txnPrepare queues a TxnPrepare: checked, bounded, copied, then run on its own goroutine.
func (s *session) txnPrepare(f sgio.Frame) {
	v, err := sgio.ViewTxnPrepare(f.Body)
	if err == nil {
		err = checkPrimaryAddr(v.Primary)
	}
	if err == nil {
		err = s.checkOwner(v.Commit.Owner)
	}
	if err != nil {
		s.srv.counters.rejectedFrames.Add(1)
		s.replyError(f.ID, err, false)
		return
	}
	n := int64(len(f.Body))
	if err := s.queueAdd(n); err != nil {
		s.srv.counters.busyReplies.Add(1)
		s.replyError(f.ID, err, false)
		return
	}
	if !s.begin(f.ID) {
		s.queueRelease(n)
		return
	}
	body := getCommitBody(len(f.Body))
	copy(*body, f.Body)
	s.srv.workers.Add(1)
	go s.runPrepare(f.ID, body)
}

// checkPrimaryAddr refuses a TxnPrepare's primary that is not empty and not host:port with a
// host and a port number 1..65535 (no scheme, path or user): this node's resolver dials it
// (Peer), and a prepared part whose primary cannot be dialed keeps its rows locked until its
// coordinator applies a decision. Which hosts may be named is not restricted: only a client
// holding the cluster's secret can send a prepare (docs/cluster.md, "Peers"). It allocates
// nothing for a valid address; the event loop may call it.
func checkPrimaryAddr(addr string) error {
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err == nil {
		n, perr := strconv.ParseUint(port, 10, 16)
		switch {
		case perr != nil || n == 0:
			err = fmt.Errorf("port %q", port)
		case host == "" || strings.ContainsAny(host, "/@?#%\\ \t"):
			err = fmt.Errorf("host %q", host)
		}
	}
	if err != nil {
		return fmt.Errorf("%w: TxnPrepare's primary %q is not host:port: %v", storenode.ErrMalformed, addr, err)
	}
	return nil
}

// runPrepare runs one TxnPrepare and replies with the prepare record's LSN.
func (s *session) runPrepare(id uint64, body *[]byte) {
	defer s.srv.workers.Done()
	defer func() {
		s.queueRelease(int64(len(*body)))
		putCommitBody(body)
	}()
	ack, err := s.prepare(*body)
	if err != nil {
		s.replyError(id, err, true)
		return
	}
	s.reply(id, ack, nil, true)
}

func (s *session) prepare(body []byte) (*sgio.CommitAck, error) {
	v, err := sgio.ViewTxnPrepare(body)
	if err != nil {
		return nil, err
	}
	if err := s.checkHolder(v.Commit.Owner); err != nil {
		return nil, err
	}
	s.renew()
	b := &storenode.Batch{Owner: v.Commit.Owner, Seq: v.Commit.Seq, Body: v.Body}
	for i := range v.Commit.FenceCount() {
		f := v.Commit.Fence(i)
		b.Fences = append(b.Fences, storenode.Fence{Table: f.Table, Epoch: f.Epoch})
	}
	var seg sgio.Segment
	for it := v.Commit.Segments(); it.Next(&seg); {
		if err := s.checkRowSize(&seg); err != nil {
			return nil, err
		}
		b.Segments = append(b.Segments, storenode.Segment{Table: seg.Table,
			Segment: logicpage.Segment{Page: seg.Page, Data: seg.Data, Clear: seg.Clear, Rows: seg.Rows}})
	}
	lsn, err := s.srv.eng.PrepareTxn(&storenode.TxnPrepare{Txn: v.Txn, Lease: v.Lease, Primary: v.Primary, Index: v.Index, Batch: b})
	if err != nil {
		return nil, err
	}
	return &sgio.CommitAck{LSN: lsn, Seq: v.Commit.Seq}, nil
}

// execTxn executes TxnDecide, TxnApply, TxnAsk and TxnReport on the request's goroutine.
func (s *session) execTxn(m sgio.Message) (sgio.Message, bool, error) {
	e := s.srv.eng
	ctx, cancel := context.WithTimeout(context.Background(), txnRequestTimeout)
	defer cancel()
	switch m := m.(type) {
	case *sgio.TxnDecide:
		d, err := e.DecideTxn(ctx, m.Txn, m.Lease, storenode.Decision(m.Decision), int(m.Count))
		if err != nil {
			return nil, true, err
		}
		return &sgio.TxnState{Decision: uint8(d)}, true, nil
	case *sgio.TxnApply:
		if err := e.ApplyTxn(m.Txn, storenode.Decision(m.Decision)); err != nil {
			return nil, true, err
		}
		return &sgio.OK{}, true, nil
	case *sgio.TxnAsk:
		d, err := e.AskTxn(ctx, m.Txn, m.Lease)
		if err != nil {
			return nil, true, err
		}
		return &sgio.TxnState{Decision: uint8(d)}, true, nil
	case *sgio.TxnReport:
		if err := e.ReportTxn(m.Txn, m.Index); err != nil {
			return nil, true, err
		}
		return &sgio.OK{}, true, nil
	}
	return nil, false, nil
}

// PeerConfig configures a TxnPeer: how this storage node's resolver connects to the
// primaries of its transactions, as a client of theirs (owner 0).
type PeerConfig struct {
	// Secret is the cluster's shared secret (sgio.ClientConfig.Secret).
	Secret []byte
	// TLS, when set, runs the connections over TLS.
	TLS *tls.Config
	// Name names this node in the primaries' logs (sgio.CheckName).
	Name string
	// DialTimeout bounds one dial and handshake; 0: sgio.DefaultDialTimeout.
	DialTimeout time.Duration
	// PeersMax bounds the connections kept (one per primary); 0: 64.
	PeersMax int
}

// Peer is the storenode.TxnPeer of a storage node: one sgio client per primary, dialed when
// first needed and again after it failed, each call bounded by its context. Any goroutine
// may call its methods. Close it after the engine.
type Peer struct {
	cfg PeerConfig

	mu      sync.Mutex
	clients map[string]*sgio.Client
	closed  bool
}

// NewTxnPeer returns a Peer for cfg (storenode.Options.TxnPeer).
func NewTxnPeer(cfg PeerConfig) *Peer {
	if cfg.PeersMax <= 0 {
		cfg.PeersMax = 64
	}
	return &Peer{cfg: cfg, clients: make(map[string]*sgio.Client)}
}

// client returns a live client of addr, dialing it (without holding mu: a dial may take up
// to DialTimeout) if needed.
func (p *Peer) client(ctx context.Context, addr string) (*sgio.Client, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, fmt.Errorf("storenode: txn peer closed: %w", sgio.ErrShuttingDown)
	}
	c := p.clients[addr]
	if c != nil && c.Err() != nil {
		delete(p.clients, addr)
		c.Close()
		c = nil
	}
	p.mu.Unlock()
	if c != nil {
		return c, nil
	}
	c, err := sgio.Dial(ctx, sgio.ClientConfig{Addr: addr, Secret: p.cfg.Secret, TLS: p.cfg.TLS, Name: p.cfg.Name,
		DialTimeout: p.cfg.DialTimeout})
	if err != nil {
		return nil, fmt.Errorf("storenode: dial primary %s: %w", addr, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return nil, fmt.Errorf("storenode: txn peer closed: %w", sgio.ErrShuttingDown)
	}
	if old := p.clients[addr]; old != nil {
		c.Close() // another call dialed meanwhile
		return old, nil
	}
	if len(p.clients) >= p.cfg.PeersMax {
		for a, old := range p.clients { // drop any one: the resolver's working set is small
			old.Close()
			delete(p.clients, a)
			break
		}
	}
	p.clients[addr] = c
	return c, nil
}

// AskTxn asks the primary at addr for the decision of id.
func (p *Peer) AskTxn(ctx context.Context, addr string, id storenode.TxnID, lease int64) (storenode.Decision, error) {
	c, err := p.client(ctx, addr)
	if err != nil {
		return storenode.DecisionNone, err
	}
	d, err := c.AskTxn(ctx, id, lease)
	return storenode.Decision(d), err
}

// ReportTxn reports to the primary at addr that participant index applied id's decision.
func (p *Peer) ReportTxn(ctx context.Context, addr string, id storenode.TxnID, index uint16) error {
	c, err := p.client(ctx, addr)
	if err != nil {
		return err
	}
	return c.ReportTxn(ctx, id, index)
}

// Close closes every connection; later calls fail with sgio.ErrShuttingDown.
func (p *Peer) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for a, c := range p.clients {
		c.Close()
		delete(p.clients, a)
	}
	return nil
}
