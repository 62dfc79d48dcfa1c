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

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// The two-phase commit requests of a session (docs/cluster.md, "Two-phase commit").
// TxnPrepare is a commit batch with a header: the loop checks its body and its owner and its
// size against the queue's bounds before copying it (as a Commit), then a goroutine of its own
// hands it to Engine.PrepareTxn, which waits for the record's sync. TxnDecide, TxnApply,
// TxnAsk and TxnReport are small and run on the request goroutine (exec), never on the loop:
// the primary's lease check (the LeaseChecker, etcd) and the waits for syncs happen there,
// each bounded by txnRequestTimeout. Who may send which is the role table's (roles.go):
// coordinators (clients) prepare, decide and apply to their own parts; the resolvers of other
// storage nodes (peers, owner 0) ask and report. A TxnDecide is checked against the
// session's owner (Engine.DecideTxnAs): only the owner that prepared the primary's part
// decides it.

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
		s.replyRejected(f.ID, err)
		return
	}
	body, ok := s.queueBody(f)
	if !ok {
		return
	}
	s.srv.workers.Add(1)
	go s.runPrepare(f.ID, body)
}

// checkPrimaryAddr refuses a TxnPrepare's primary that is not empty and not host:port with a
// host and a port number 1..65535 (no scheme, path or user): this node's resolver dials it
// (Peer), and a prepared part whose primary cannot be dialed keeps its rows locked until its
// coordinator applies a decision. That the host is one of the cluster's storage nodes is
// checked off the loop, in prepare (Peer.CheckPrimary: it may read etcd). It allocates
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
	if err := s.checkPrimary(v.Primary); err != nil {
		return nil, err
	}
	s.renew()
	b := &base.Batch{Owner: v.Commit.Owner, Seq: v.Commit.Seq, Body: v.Body}
	for i := range v.Commit.FenceCount() {
		f := v.Commit.Fence(i)
		b.Fences = append(b.Fences, f)
	}
	var seg base.Segment
	for it := v.Commit.Segments(); it.Next(&seg); {
		if err := s.checkRowSize(&seg); err != nil {
			return nil, err
		}
		b.Segments = append(b.Segments, seg)
	}
	lsn, err := s.srv.eng.PrepareTxn(&base.TxnPrepare{Txn: v.Txn, Lease: v.Lease, Primary: v.Primary, Index: v.Index, Batch: b})
	if err != nil {
		return nil, err
	}
	return &sgio.CommitAck{LSN: lsn, Seq: v.Commit.Seq}, nil
}

// primaryChecker is the TxnPeer's check of a prepare's primary (Peer.CheckPrimary).
type primaryChecker interface {
	CheckPrimary(ctx context.Context, addr string) error
}

// checkPrimary refuses a prepare naming a primary this node's resolver would not dial (not a
// storage node of the cluster): the coordinator hears it at once, rather than its part
// staying in doubt. Without a TxnPeer that checks, any primary is accepted (and the resolver,
// if any, decides whether it dials it).
func (s *session) checkPrimary(addr string) error {
	pc, ok := s.srv.cfg.Options.TxnPeer.(primaryChecker)
	if addr == "" || !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), txnRequestTimeout)
	defer cancel()
	if err := pc.CheckPrimary(ctx, addr); err != nil {
		return fmt.Errorf("storenode: TxnPrepare: %w", err)
	}
	return nil
}

// execTxn executes TxnDecide, TxnApply, TxnAsk, TxnReport and TxnDoubt on the request's
// goroutine.
func (s *session) execTxn(m sgio.Message) (sgio.Message, bool, error) {
	e := s.srv.eng
	ctx, cancel := context.WithTimeout(context.Background(), txnRequestTimeout)
	defer cancel()
	switch m := m.(type) {
	case *sgio.TxnDecide:
		d, err := e.DecideTxnAs(ctx, s.owner, m.Txn, m.Lease, base.Decision(m.Decision), int(m.Count), s.id)
		if err != nil {
			return nil, true, err
		}
		return &sgio.TxnState{Decision: uint8(d)}, true, nil
	case *sgio.TxnApply:
		// A coordinator applies the decision to its own parts only; an operator to any
		// (roles.go: a peer sends none).
		var err error
		if s.role&roleOperator == 0 {
			err = e.ApplyTxnAs(m.Txn, base.Decision(m.Decision), s.owner)
		} else {
			err = e.ApplyTxn(m.Txn, base.Decision(m.Decision))
		}
		if err != nil {
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
	case *sgio.TxnDoubt:
		r, err := s.txnDoubt(m)
		return r, true, err
	}
	return nil, false, nil
}

// PeerConfig configures a TxnPeer: how this storage node's resolver connects to the
// primaries of its transactions, as a client of theirs (owner 0).
type PeerConfig struct {
	// Secret is the peers' secret of the primaries (their Config.PeerSecret; empty on a
	// loopback cluster without secrets): a resolver's Ask and Report are peers' requests.
	Secret []byte
	// TLS, when set, runs the connections over TLS.
	TLS *tls.Config
	// Name names this node in the primaries' logs (sgio.CheckName).
	Name string
	// DialTimeout bounds one dial and handshake; 0: sgio.DefaultDialTimeout.
	DialTimeout time.Duration
	// PeersMax bounds the connections kept (one per primary); 0: 64. Calls beyond it, with
	// every kept one in use, dial one of their own for the call (at most the resolver's
	// concurrent primaries, storenode.Options.TxnResolvePrimariesMax).
	PeersMax int
	// Peers are storage nodes' addresses (host:port, as coordinators name them) the resolver
	// may dial: the static list of a deployment without etcd (-peers).
	Peers []string
	// Directory, when set, lists the other storage nodes the resolver may dial too: in
	// cluster mode the partition map's (cluster.Client). With neither Peers nor Directory
	// the resolver dials nobody (peer_directory.go).
	Directory PeerDirectory
	// Now is the clock of the Directory's cache; nil: time.Now.
	Now func() time.Time
	// After is the timer of a check's wait for the Directory's next read; nil: time.After.
	After func(time.Duration) <-chan time.Time
}

// Peer is the storenode.TxnPeer of a storage node: one sgio client per primary, dialed when
// first needed and again after it failed, each call bounded by its context. Any goroutine
// may call its methods (the resolver calls distinct primaries concurrently). At most
// PeersMax connections are kept; one a call is using is never closed to make room for
// another: at the bound with every kept connection in use, a call dials one of its own,
// closed when the call ends. Close it after the engine.
type Peer struct {
	cfg PeerConfig
	dir *peerDirectory

	mu      sync.Mutex
	clients map[string]*peerClient
	closed  bool
}

// peerClient is a Peer's connection to one primary and the calls using it (under Peer.mu).
type peerClient struct {
	c     *sgio.Client
	users int
}

// NewTxnPeer returns a Peer for cfg (storenode.Options.TxnPeer).
func NewTxnPeer(cfg PeerConfig) *Peer {
	if cfg.PeersMax <= 0 {
		cfg.PeersMax = 64
	}
	return &Peer{cfg: cfg, dir: newPeerDirectory(&cfg), clients: make(map[string]*peerClient)}
}

// CheckPrimary returns nil when the Peer may dial addr (a storage node of the cluster:
// PeerConfig.Peers, the Directory), or when it may dial nobody at all (no list configured: a
// part naming addr then waits for its coordinator), else an error wrapping
// ErrUnknownPrimary. A storage node's TxnPrepare calls it, so a client naming another
// primary is told before any part is kept (within peerDirectoryMissEvery: a miss waits for
// the Directory's next read).
func (p *Peer) CheckPrimary(ctx context.Context, addr string) error {
	if addr == "" || !p.dir.configured() {
		return nil
	}
	return p.dir.check(ctx, addr)
}

// client returns a live client of addr for one call, dialing it (without holding mu: a dial
// may take up to DialTimeout) if needed; the call ends with done(pc).
func (p *Peer) client(ctx context.Context, addr string) (*peerClient, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, fmt.Errorf("storenode: txn peer closed: %w", sgio.ErrShuttingDown)
	}
	pc := p.clients[addr]
	var broken *sgio.Client
	if pc != nil && pc.c.Err() != nil {
		delete(p.clients, addr) // its users close it when they are done
		if pc.users == 0 {
			broken = pc.c
		}
		pc = nil
	}
	if pc != nil {
		pc.users++
	}
	p.mu.Unlock()
	if broken != nil {
		broken.Close()
	}
	if pc != nil {
		return pc, nil
	}
	if err := p.dir.check(ctx, addr); err != nil {
		return nil, err // never dial with the peers' secret an address a client named
	}
	c, err := sgio.Dial(ctx, sgio.ClientConfig{Addr: addr, Secret: p.cfg.Secret, TLS: p.cfg.TLS, Name: p.cfg.Name,
		DialTimeout: p.cfg.DialTimeout})
	if err != nil {
		return nil, fmt.Errorf("storenode: dial primary %s: %w", addr, err)
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.Close()
		return nil, fmt.Errorf("storenode: txn peer closed: %w", sgio.ErrShuttingDown)
	}
	if old := p.clients[addr]; old != nil {
		old.users++ // another call dialed meanwhile
		p.mu.Unlock()
		c.Close()
		return old, nil
	}
	pc = &peerClient{c: c, users: 1}
	var evicted *sgio.Client
	if len(p.clients) >= p.cfg.PeersMax {
		for a, old := range p.clients { // any idle one: the resolver's working set is small
			if old.users == 0 {
				evicted = old.c
				delete(p.clients, a)
				break
			}
		}
	}
	if len(p.clients) < p.cfg.PeersMax {
		p.clients[addr] = pc
	} // else every kept one is in use: pc is this call's own, closed by done
	p.mu.Unlock()
	if evicted != nil {
		evicted.Close()
	}
	return pc, nil
}

// done ends a call's use of pc (client), closing it when it is no longer kept.
func (p *Peer) done(addr string, pc *peerClient) {
	p.mu.Lock()
	pc.users--
	drop := pc.users == 0 && p.clients[addr] != pc
	p.mu.Unlock()
	if drop {
		pc.c.Close()
	}
}

// AskTxn asks the primary at addr for the decision of id.
func (p *Peer) AskTxn(ctx context.Context, addr string, id base.TxnID, lease int64) (base.Decision, error) {
	pc, err := p.client(ctx, addr)
	if err != nil {
		return base.DecisionNone, err
	}
	defer p.done(addr, pc)
	d, err := pc.c.AskTxn(ctx, id, lease)
	return base.Decision(d), err
}

// ReportTxn reports to the primary at addr that participant index applied id's decision.
func (p *Peer) ReportTxn(ctx context.Context, addr string, id base.TxnID, index uint16) error {
	pc, err := p.client(ctx, addr)
	if err != nil {
		return err
	}
	defer p.done(addr, pc)
	return pc.c.ReportTxn(ctx, id, index)
}

// Close closes every connection; later calls fail with sgio.ErrShuttingDown.
func (p *Peer) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for a, pc := range p.clients {
		pc.c.Close() // a call using it fails at once; its done finds it no longer kept
		delete(p.clients, a)
	}
	return nil
}
