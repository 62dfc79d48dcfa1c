package server

import (
	"sync/atomic"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/latency"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// The server's counters (Stats), their descriptions for the metrics endpoint and the Stats
// request (StatDescs), and the commit latency histogram.

// Stats are a server's counters, beside its engine's Stats.
type Stats struct {
	// Conns is the number of connections open now; ConnsAccepted those accepted since Start;
	// ConnsRejected those refused (over MaxConns, or while shutting down).
	Conns, ConnsAccepted, ConnsRejected uint64
	// AuthFailures counts wrong proofs and requests before authentication; AuthTimeouts
	// connections closed at the auth deadline; IdleCloses sessions closed for idleness.
	AuthFailures, AuthTimeouts, IdleCloses uint64
	// RejectedFrames counts frames that broke the protocol (bad magic, checksum, length,
	// version, unknown type, malformed body); BusyReplies requests refused with ErrBusy.
	RejectedFrames, BusyReplies uint64
	// ForbiddenRequests counts requests refused with ErrForbidden: outside the role of the
	// caller's secret (roles.go).
	ForbiddenRequests uint64
	// Requests counts requests received; Writes the writes (writev calls) that carried their
	// replies; BytesIn and BytesOut the frame bytes received and sent.
	Requests, Writes, BytesIn, BytesOut uint64
	// InFlight is the number of requests received and not yet answered.
	InFlight int64
	// Handshaking and Authenticated are the connections in the handshake and the
	// authenticated sessions now; Evictions the handshaking connections closed to make room;
	// AcceptErrors the failed accepts (EMFILE...), each retried after a back-off.
	Handshaking, Authenticated, Evictions, AcceptErrors uint64
	// QueuedBytes is the request bytes (commits, waiting reads) queued on all connections now.
	QueuedBytes int64
	// OutboundBytes is the reply bytes written but not yet taken by their clients (gnet's
	// outbound buffers) on all connections, as last seen; OutboundPauses counts the turns in
	// which a connection was not read because it was over MaxOutboundBytesTotal.
	OutboundBytes  int64
	OutboundPauses uint64
}

type serverCounters struct {
	accepted, rejected          atomic.Uint64
	authFailures, authTimeouts  atomic.Uint64
	idleCloses                  atomic.Uint64
	rejectedFrames, busyReplies atomic.Uint64
	forbiddenRequests           atomic.Uint64
	requests, writes            atomic.Uint64
	bytesIn, bytesOut           atomic.Uint64
	evictions, acceptErrors     atomic.Uint64
	outboundPauses              atomic.Uint64
}

// CommitLatency returns the histogram of acknowledged Commits' times, from a request's
// arrival on the event loop to its acknowledgement (the engine's group commit and WAL sync
// included). Any goroutine.
func (s *Server) CommitLatency() latency.Snapshot { return s.commitLatency.Snapshot() }

// Stats reports the server's counters.
func (s *Server) Stats() Stats {
	c := &s.counters
	hs, au := s.admissionStats()
	return Stats{
		Conns:             uint64(max(s.conns.Load(), 0)),
		ConnsAccepted:     c.accepted.Load(),
		ConnsRejected:     c.rejected.Load(),
		AuthFailures:      c.authFailures.Load(),
		AuthTimeouts:      c.authTimeouts.Load(),
		IdleCloses:        c.idleCloses.Load(),
		RejectedFrames:    c.rejectedFrames.Load(),
		BusyReplies:       c.busyReplies.Load(),
		ForbiddenRequests: c.forbiddenRequests.Load(),
		Requests:          c.requests.Load(),
		Writes:            c.writes.Load(),
		BytesIn:           c.bytesIn.Load(),
		BytesOut:          c.bytesOut.Load(),
		InFlight:          s.requests.count(),
		Handshaking:       uint64(hs),
		Authenticated:     uint64(au),
		Evictions:         c.evictions.Load(),
		AcceptErrors:      c.acceptErrors.Load(),
		QueuedBytes:       s.queued.Load(),
		OutboundBytes:     s.outbound.Load(),
		OutboundPauses:    c.outboundPauses.Load(),
	}
}

// statsReply is the StatsReply of a Stats request: the engine's stats, then the server's, in
// their tables' order (storenode.StatDescs, StatDescs).
func (s *Server) statsReply() *sgio.StatsReply {
	es := s.eng.Stats()
	ss := s.Stats()
	descs := StatDescs()
	stats := make([]base.Stat, 0, len(storenode.StatDescs())+len(descs))
	stats = storenode.AppendStats(stats, storenode.StatDescs(), &es)
	return &sgio.StatsReply{Stats: storenode.AppendStats(stats, descs, &ss)}
}

// StatDescs returns the server's stats (its Stats), in the order they are listed and sent,
// after the engine's (storenode.StatDescs). The slice is shared: callers must not modify it.
func StatDescs() []storenode.StatDesc[Stats] { return serverStatDescs }

// statValue is v as a stat's value: every row of the table reads its field through it, a
// negative gauge (never expected) as 0.
func statValue[N int64 | uint64](v N) uint64 { return uint64(max(v, 0)) }

var serverStatDescs = []storenode.StatDesc[Stats]{
	{Name: "connections", Help: "Connections open now.", Kind: storenode.StatGauge, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.Conns) }},
	{Name: "connections_accepted", Help: "Connections accepted.", Kind: storenode.StatCounter, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.ConnsAccepted) }},
	{Name: "connections_rejected", Help: "Connections refused: over --max-conns, or during shutdown.", Kind: storenode.StatCounter, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.ConnsRejected) }},
	{Name: "auth_failures", Help: "Handshakes failed: wrong secret, or requests before authentication.", Kind: storenode.StatCounter, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.AuthFailures) }},
	{Name: "auth_timeouts", Help: "Connections closed for not authenticating within --auth-timeout.", Kind: storenode.StatCounter, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.AuthTimeouts) }},
	{Name: "idle_closes", Help: "Sessions closed after --idle-timeout without traffic.", Kind: storenode.StatCounter, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.IdleCloses) }},
	{Name: "rejected_frames", Help: "Frames that broke the protocol (bad magic, checksum, length, type or body).", Kind: storenode.StatCounter, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.RejectedFrames) }},
	{Name: "busy_replies", Help: "Requests refused with ErrBusy: over --max-inflight or the queued-bytes bounds.", Kind: storenode.StatCounter, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.BusyReplies) }},
	{Name: "forbidden_requests", Help: "Requests refused with ErrForbidden: outside the role of the caller's secret (client, peer, operator).", Kind: storenode.StatCounter, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.ForbiddenRequests) }},
	{Name: "requests", Help: "Requests received after authentication.", Kind: storenode.StatCounter, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.Requests) }},
	{Name: "requests_in_flight", Help: "Requests received and not yet answered.", Kind: storenode.StatGauge, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.InFlight) }},
	{Name: "reply_writes", Help: "Writes (writev calls) carrying replies; requests_total / reply_writes_total is the batching factor.", Kind: storenode.StatCounter, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.Writes) }},
	{Name: "received_bytes", Help: "Frame bytes received.", Kind: storenode.StatCounter, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.BytesIn) }},
	{Name: "sent_bytes", Help: "Frame bytes sent.", Kind: storenode.StatCounter, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.BytesOut) }},
	{Name: "connections_handshaking", Help: "Connections in the handshake now (bounded by --max-handshakes).", Kind: storenode.StatGauge, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.Handshaking) }},
	{Name: "sessions_authenticated", Help: "Authenticated sessions now.", Kind: storenode.StatGauge, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.Authenticated) }},
	{Name: "handshake_evictions", Help: "Handshaking connections closed to make room for newer ones.", Kind: storenode.StatCounter, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.Evictions) }},
	{Name: "accept_errors", Help: "Failed accepts (EMFILE...), each retried after a back-off.", Kind: storenode.StatCounter, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.AcceptErrors) }},
	{Name: "commit_queued_bytes", Help: "Request bytes queued on all connections: commits for the engine, reads for their goroutine (bounded by --max-queued-bytes-total).", Kind: storenode.StatGauge, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.QueuedBytes) }},
	{Name: "outbound_bytes", Help: "Reply bytes written but not yet taken by their clients, on all connections (bounded by MaxOutboundBytesTotal, then what replies in flight add).", Kind: storenode.StatGauge, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.OutboundBytes) }},
	{Name: "outbound_pauses", Help: "Event-loop turns in which a connection was not read because the replies waiting on all connections were over their bound.", Kind: storenode.StatCounter, Unit: storenode.UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.OutboundPauses) }},
}
