package server

import (
	"context"
	"fmt"
	"net"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// The partition move requests of a session (docs/cluster.md, "Moving a partition"). Move is
// small and runs on the request goroutine (exec), never on the loop: a freeze, an activation
// or a begin waits for its record's sync. MoveWrite carries rows: the loop bounds its body
// against the queue's limits and copies it (as a Commit), then a goroutine of its own hands
// it to Engine.MoveWrite, which waits for the record's sync. Any authenticated session may
// send them (a mover is a cluster node, holding the cluster's secret, like a resolver); on
// a node with etcd, begin, freeze, thaw, retire and activate run only once etcd's move
// record and map allow them (storenode/move_verify.go), whoever sends them.

// movePagesReply bounds the pages of one MoveState reply so that it fits smallReplyBound.
const movePagesReply = (smallReplyBound - sgio.HeaderSize - 24) / 8

// moveWrite queues a MoveWrite: bounded, copied, then run on its own goroutine.
func (s *session) moveWrite(f sgio.Frame) {
	body, ok := s.queueBody(f)
	if !ok {
		return
	}
	s.srv.workers.Add(1)
	go s.runMoveWrite(f.ID, body)
}

// runMoveWrite runs one MoveWrite and replies with its record's LSN.
func (s *session) runMoveWrite(id uint64, body *[]byte) {
	defer s.srv.workers.Done()
	defer func() {
		s.queueRelease(int64(len(*body)))
		putCommitBody(body)
	}()
	lsn, err := s.execMoveWrite(*body)
	if err != nil {
		s.replyError(id, err, true)
		return
	}
	s.reply(id, &sgio.CommitAck{LSN: lsn}, nil, true)
}

func (s *session) execMoveWrite(body []byte) (uint64, error) {
	v, err := sgio.ViewCommit(body)
	if err != nil {
		return 0, err
	}
	// The mover epoch is every fence's (one fence per table written, all of one epoch).
	if v.FenceCount() == 0 {
		return 0, fmt.Errorf("storenode: MoveWrite without a fence (its mover epoch): %w", sgio.ErrMalformed)
	}
	epoch := v.Fence(0).Epoch
	for i := range v.FenceCount() {
		if v.Fence(i).Epoch != epoch {
			return 0, fmt.Errorf("storenode: MoveWrite with fences of mover epochs %d and %d: %w", epoch, v.Fence(i).Epoch, sgio.ErrMalformed)
		}
	}
	segs := make([]base.Segment, 0, v.SegmentCount())
	var seg base.Segment
	for it := v.Segments(); it.Next(&seg); {
		if err := s.checkRowSize(&seg); err != nil {
			return 0, err
		}
		segs = append(segs, seg)
	}
	return s.srv.eng.MoveWrite(segs, epoch)
}

// moveSteps are the Move ops verified against etcd before they run (VerifyMoveStep).
var moveSteps = [...]storenode.MoveStep{
	sgio.MoveOpBegin:    storenode.MoveStepBegin,
	sgio.MoveOpFreeze:   storenode.MoveStepFreeze,
	sgio.MoveOpThaw:     storenode.MoveStepThaw,
	sgio.MoveOpRetire:   storenode.MoveStepRetire,
	sgio.MoveOpActivate: storenode.MoveStepActivate,
}

// moveSelf is the address etcd's partition map must name this storage node by for its move
// steps to be verified: Config.Advertise, else the address it listens on (set before any
// session exists, never changed). "" when that is an unspecified address (0.0.0.0, [::]),
// which the map cannot name: such a node refuses verified move steps
// (storenode.ErrNoVerifier).
func (srv *Server) moveSelf() string {
	if srv.cfg.Advertise != "" {
		return srv.cfg.Advertise
	}
	a, ok := srv.addr.(*net.TCPAddr)
	if !ok || a.IP == nil || a.IP.IsUnspecified() {
		return ""
	}
	return a.String()
}

// execMove executes one Move step on the request's goroutine. A step that changes the
// table's move state is first verified against etcd (storenode's VerifyMoveStep: bounded by
// the engine's GrantVerifyTimeout and its verification slots), "this node" being the
// address the server listens on (moveSelf).
func (s *session) execMove(m *sgio.Move) (sgio.Message, error) {
	e := s.srv.eng
	r := &sgio.MoveState{}
	var err error
	if int(m.Op) < len(moveSteps) && moveSteps[m.Op] != 0 {
		if err := e.VerifyMoveStep(context.Background(), m.Table, moveSteps[m.Op], m.Token, m.Floor, s.srv.moveSelf(), s.id); err != nil {
			return nil, err
		}
	}
	switch m.Op {
	case sgio.MoveOpBegin:
		err = e.MoveBegin(m.Table, m.Token)
	case sgio.MoveOpMark:
		r.Token, err = e.MoveMark(m.Table)
	case sgio.MoveOpChanges:
		max := movePagesReply
		if m.MaxPages > 0 {
			max = min(max, int(m.MaxPages))
		}
		r.Pages, r.More, err = e.MoveChanges(m.Table, m.Token, max, nil)
	case sgio.MoveOpFreeze:
		_, err = e.MoveFreeze(m.Table, m.Token)
	case sgio.MoveOpThaw:
		err = e.MoveThaw(m.Table, m.Token)
	case sgio.MoveOpRetire:
		err = e.MoveRetire(m.Table, m.Token)
	case sgio.MoveOpActivate:
		err = e.MoveActivate(m.Table, m.Token, m.Floor, m.NextID)
	}
	if err != nil {
		return nil, err
	}
	st, next, err := e.MoveStatus(m.Table)
	if err != nil {
		return nil, err
	}
	r.State, r.NextID = uint8(st), next
	return r, nil
}
