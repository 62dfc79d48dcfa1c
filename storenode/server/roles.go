package server

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/weftdb/weft/sgio"
)

// Roles (docs/operations.md, "Roles and credentials"). A storage node tells three kinds of
// caller apart by the secret whose key verifies the handshake's client proof: clients (game
// servers, transaction nodes: Config.Secret), peers (the cluster's other storage nodes:
// Config.PeerSecret) and operators (the weft CLI, the mover, cluster tooling:
// Config.OperatorSecret). The wire does not change: the server tries each configured key.
//
// Invariants:
//   - a session's role is fixed at authentication, from the one key that verified its proof
//     (the keys are distinct: New refuses duplicates with ErrRoleSecrets), and the server's
//     proof is made with that same key;
//   - a request type outside the session's role is refused with sgio.ErrForbidden at the top
//     of session.handle, before its body is parsed or anything (a renewal, a queue, the
//     engine) is touched; what a request may touch within an allowed type (another owner's
//     table or transaction part) is checked where it is executed (roleMayDrop, TxnApply);
//   - a client proves the clients' secret (the master: any owner id its Hello claims) or the
//     derived secret of the owner id its Hello claims (sgio.DeriveOwnerKey: that owner id
//     only, as no other id's key is derivable from it); a game server holds its owner's;
//   - without any secret configured (loopback only) every session has every role, as before
//     roles existed; a role whose secret is not configured is nobody's, but that of clients
//     when Secret alone is empty (loopback only: clients then prove the empty key).

// role is a set of roles, one bit each.
type role uint8

const (
	roleClient role = 1 << iota
	rolePeer
	roleOperator

	rolesAll = roleClient | rolePeer | roleOperator
)

// String names the roles of r, joined by "+".
func (r role) String() string {
	var names []string
	for _, n := range [...]struct {
		r    role
		name string
	}{{roleClient, "client"}, {rolePeer, "peer"}, {roleOperator, "operator"}} {
		if r&n.r != 0 {
			names = append(names, n.name)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, "+")
}

// roleTable says, per request type, which roles may send it (docs/operations.md has the same
// table, with what each may touch). A type not listed is nobody's: sgio knows no such
// request, or it is the handshake's (Hello, Auth: never sent on an open session).
var roleTable = [0x80]role{
	sgio.TypePing:  rolesAll,
	sgio.TypeStats: rolesAll,

	// A client's own tables: the catalog, ownership and ids, reads and commits. A drop of a
	// table another owner ever held here is an operator's (mayDrop).
	sgio.TypeCreateTable:        roleClient | roleOperator,
	sgio.TypeOpenTable:          roleClient | roleOperator,
	sgio.TypeListTables:         roleClient | roleOperator,
	sgio.TypeDropTable:          roleClient | roleOperator,
	sgio.TypeCreateClusterTable: roleClient | roleOperator,
	sgio.TypeAcquire:            roleClient | roleOperator,
	sgio.TypeAllocIDs:           roleClient | roleOperator,
	sgio.TypeRelease:            roleClient | roleOperator,
	sgio.TypeReadPages:          roleClient | roleOperator,
	sgio.TypePageDir:            roleClient | roleOperator,
	sgio.TypeCommit:             roleClient | roleOperator,

	// Two-phase commit: a coordinator (a client) prepares, decides at the primary and applies
	// the decision to its own parts (a client's TxnApply of another owner's part is refused:
	// execTxn); a participant's resolver (a peer) asks the primary and reports to it.
	sgio.TypeTxnPrepare: roleClient | roleOperator,
	sgio.TypeTxnDecide:  roleClient | roleOperator,
	sgio.TypeTxnApply:   roleClient | rolePeer | roleOperator,
	sgio.TypeTxnAsk:     rolePeer,
	sgio.TypeTxnReport:  rolePeer,

	// Operations: backups, and the mover's steps and copies (cluster/node's mover dials with
	// the operator's secret; MoveWrite is also a peer's, for copies pushed by a storage node).
	sgio.TypeBackup:    roleOperator,
	sgio.TypeMove:      roleOperator,
	sgio.TypeMoveWrite: rolePeer | roleOperator,

	// Transactions in doubt, listed and aborted by an operator (weft txn).
	sgio.TypeTxnDoubt: roleOperator,
}

// allows reports whether a session of roles r may send a request of type t. It allocates
// nothing; the event loop calls it for every request.
func (r role) allows(t sgio.Type) bool { return t < sgio.Type(len(roleTable)) && roleTable[t]&r != 0 }

// roleKey is the HMAC key of one role's secret.
type roleKey struct {
	role role
	key  []byte
}

// roleKeys decodes the configured secrets into the keys authentication tries, in order:
// one empty key of every role when none is configured, else one per configured role (and
// the empty key of clients when Secret alone is empty: checkListen allows that on loopback
// only).
func roleKeys(c *Config) ([]roleKey, error) {
	secrets := [...]struct {
		role role
		name string
		text []byte
	}{{roleClient, "Secret", c.Secret}, {rolePeer, "PeerSecret", c.PeerSecret}, {roleOperator, "OperatorSecret", c.OperatorSecret}}
	var keys []roleKey
	for _, s := range secrets {
		if len(bytes.TrimSpace(s.text)) == 0 {
			continue
		}
		key, err := sgio.ParseSecret(s.text)
		if err != nil {
			return nil, fmt.Errorf("storenode: Config.%s: %w", s.name, err)
		}
		for _, k := range keys {
			if bytes.Equal(k.key, key) {
				return nil, fmt.Errorf("%w: %s is the %v role's", ErrRoleSecrets, s.name, k.role)
			}
		}
		keys = append(keys, roleKey{role: s.role, key: key})
	}
	if len(keys) == 0 {
		return []roleKey{{role: rolesAll, key: nil}}, nil
	}
	if len(bytes.TrimSpace(c.Secret)) == 0 {
		keys = append([]roleKey{{role: roleClient, key: nil}}, keys...)
	}
	return keys, nil
}

// clientsKey reports the key of the clients' secret, from which the owners' keys derive
// (sgio.DeriveOwnerKey): nil when Secret is not configured (no owner keys then).
func clientsKey(keys []roleKey) []byte {
	for _, k := range keys {
		if k.role == roleClient && k.key != nil {
			return k.key
		}
	}
	return nil
}

// authRole reports the roles and the key of the secret that makes proof the client's proof
// for these nonces and transcript, or an error wrapping sgio.ErrAuthFailed when none does.
// bound reports that the key is owner's derived key (sgio.DeriveOwnerKey: owner is the owner
// id the Hello claims), whose session is a client of that owner id only; its key is written
// into ownerKey, the session's. Every key is tried (at most three HMACs, and two more for
// the owner's key when the clients' secret is configured: its derivation and its proof), so
// the time taken does not say which matched.
func (s *Server) authRole(owner uint64, ownerKey *[sgio.OwnerKeySize]byte, serverNonce, clientNonce [sgio.NonceSize]byte,
	transcript [sgio.TranscriptSize]byte, proof [sgio.ProofSize]byte) (r role, key []byte, bound bool, err error) {
	for _, k := range s.keys {
		if sgio.ProofEqual(sgio.ClientProof(k.key, serverNonce, clientNonce, transcript), proof) && r == 0 {
			r, key = k.role, k.key
		}
	}
	if s.clientsKey != nil {
		*ownerKey = sgio.DeriveOwnerKey(s.clientsKey, owner)
		if sgio.ProofEqual(sgio.ClientProof(ownerKey[:], serverNonce, clientNonce, transcript), proof) && r == 0 {
			r, key, bound = roleClient, ownerKey[:], true
		}
	}
	if r == 0 {
		return 0, nil, false, fmt.Errorf("sgio: client proof mismatch (wrong secret): %w", sgio.ErrAuthFailed)
	}
	return r, key, bound, nil
}

// forbid answers a request outside the session's roles with sgio.ErrForbidden and counts it;
// the session stays open (a caller with the wrong credential is told, not cut off).
func (s *session) forbid(f sgio.Frame) {
	s.srv.counters.forbiddenRequests.Add(1)
	s.srv.limitedLog("storenode: request outside the caller's role", "conn", s.id, "remote", s.remote,
		"name", s.name, "request", f.Type.String(), "role", s.role.String())
	s.replyError(f.ID, fmt.Errorf("storenode: %v is not a request of the %v role: %w", f.Type, s.role, sgio.ErrForbidden), false)
}

// mayDrop reports nil when the session may drop table name: an operator any table, a client
// a table no other owner ever held here (Engine.TableOnlyHeldBy: never granted, or the
// client holds or last held its first grant), so that a client that acquires another
// owner's released table cannot then drop it (the engine then applies its own rules: a live
// lease, etcd's map). A table that does not exist is the engine's to report.
func (s *session) mayDrop(name string) error {
	if s.role&roleOperator != 0 {
		return nil
	}
	only, err := s.srv.eng.TableOnlyHeldBy(name, s.owner)
	if err != nil || only {
		return nil
	}
	return fmt.Errorf("storenode: table %q was held by another owner (or granted more than once): dropping it is an operator's request: %w", name, sgio.ErrForbidden)
}
