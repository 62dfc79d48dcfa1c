package cluster

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdTxnOpsMax is how many operations this package puts in one etcd transaction: etcd's
// default --max-txn-ops is 128. A table's creation writes Partitions+1 keys in one
// transaction, so a cluster with tables of more than 127 partitions needs etcd started with
// a larger --max-txn-ops (docs/cluster.md, "Running etcd").
const etcdTxnOpsMax = 128

// TableMap is one table's entry of the partition map: its layout and, per partition, the
// storage node serving it with the revision of that entry. Immutable once returned.
type TableMap struct {
	Name   string
	Layout Layout
	// Created is the etcd revision of the table's creation: a table dropped and created
	// again under the same name has another.
	Created int64
	// Nodes[p] is the address of the storage node serving partition p.
	Nodes []string
	// Revs[p] is the etcd revision of partition p's entry (its last switch): the compare of
	// SwitchPartition.
	Revs []int64
}

// Map is a snapshot of the partition map: every complete table, as of etcd revision
// Revision. Immutable once returned; any goroutine may read it.
type Map struct {
	// Revision is the etcd revision the snapshot reflects: every change up to it is in.
	Revision int64
	// Tables by name.
	Tables map[string]*TableMap
	// Broken names the tables whose entries failed to decode or are incomplete (a foreign
	// writer, a version skew): left out of Tables, with the reason.
	Broken map[string]error
}

// Table returns the named table's entry (ErrTableNotFound when absent).
func (m *Map) Table(name string) (*TableMap, error) {
	if t := m.Tables[name]; t != nil {
		return t, nil
	}
	if err := m.Broken[name]; err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("%w: %q (map revision %d)", ErrTableNotFound, name, m.Revision)
}

// NodeOf returns the storage node serving row id's partition.
func (t *TableMap) NodeOf(id uint64) string { return t.Nodes[t.Layout.Of(id)] }

// CreateTable adds a table to the partition map: its layout (fixed from now on) and the
// storage node of each partition (len(nodes) == layout.Partitions), in one etcd transaction
// that succeeds only if the name is free (ErrTableExists otherwise). It returns the entry as
// created. It does not create the table on the storage nodes.
func (c *Client) CreateTable(ctx context.Context, name string, layout Layout, nodes []string) (*TableMap, error) {
	if err := validTableName(name); err != nil {
		return nil, err
	}
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	if len(nodes) != int(layout.Partitions) {
		return nil, fmt.Errorf("%w: %d storage nodes for %d partitions", ErrInvalid, len(nodes), layout.Partitions)
	}
	if len(nodes)+1 > etcdTxnOpsMax {
		return nil, fmt.Errorf("%w: %d partitions: at most %d in one etcd transaction", ErrInvalid, len(nodes), etcdTxnOpsMax-1)
	}
	for _, a := range nodes {
		if err := validAddr(a, false); err != nil {
			return nil, err
		}
	}
	tk := c.keys.table(name)
	ops := make([]clientv3.Op, 0, len(nodes)+1)
	ops = append(ops, clientv3.OpPut(tk, string(encodeTable(layout))))
	for p, a := range nodes {
		ops = append(ops, clientv3.OpPut(c.keys.part(name, uint32(p)), string(encodePartition(a))))
	}
	// The compare covers the partition keys too: a half-dropped table (impossible through
	// this package, which drops in one transaction) or a foreign key blocks the creation.
	resp, err := c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(tk), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(c.keys.parts(name)).WithPrefix(), "=", 0)).
		Then(ops...).Commit()
	if err != nil {
		return nil, unavailable("create table "+name, err)
	}
	if !resp.Succeeded {
		return nil, fmt.Errorf("%w: %q", ErrTableExists, name)
	}
	rev := resp.Header.Revision
	t := &TableMap{Name: name, Layout: layout, Created: rev, Nodes: slices.Clone(nodes), Revs: make([]int64, len(nodes))}
	for p := range t.Revs {
		t.Revs[p] = rev
	}
	return t, nil
}

// DropTable removes a table from the partition map, with its owner keys, in one etcd
// transaction (the holders see their ownership lost). ErrTableNotFound when absent.
func (c *Client) DropTable(ctx context.Context, name string) error {
	if err := validTableName(name); err != nil {
		return err
	}
	tk := c.keys.table(name)
	resp, err := c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(tk), ">", 0)).
		Then(clientv3.OpDelete(tk), clientv3.OpDelete(c.keys.parts(name), clientv3.WithPrefix()),
			clientv3.OpDelete(c.keys.owners(name), clientv3.WithPrefix())).
		Commit()
	if err != nil {
		return unavailable("drop table "+name, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: %q", ErrTableNotFound, name)
	}
	return nil
}

// ReadMap reads the whole partition map from etcd (a linearizable read: every change
// acknowledged before it is in).
func (c *Client) ReadMap(ctx context.Context) (*Map, error) {
	m, _, err := c.readMapState(ctx)
	return m, err
}

// SwitchPartition points partition part of table at storage node to, in one etcd
// transaction that succeeds only if the partition's entry still has revision rev (the Revs[p]
// the caller read; ErrInvalid unless > 0, so only an existing entry is switched) and the
// table is the one created at created: the switch step of a partition move. It returns the
// entry's new revision, or ErrMapChanged (nothing changed) when the compare failed, or
// ErrTableNotFound.
//
// extra conditions the switch also requires, for the move protocol of the next layers (no
// owner, no in-doubt transaction): each must hold in the same transaction.
func (c *Client) SwitchPartition(ctx context.Context, table string, created int64, part uint32, rev int64, to string, extra ...clientv3.Cmp) (int64, error) {
	if err := validTableName(table); err != nil {
		return 0, err
	}
	if err := validAddr(to, false); err != nil {
		return 0, err
	}
	if rev <= 0 {
		// A compare of ModRevision with 0 holds for a missing key: the switch would write
		// an entry beyond the table's partitions, which breaks the table for every reader.
		return 0, fmt.Errorf("%w: partition entry revision %d (an existing entry's, > 0)", ErrInvalid, rev)
	}
	if len(extra) > etcdTxnOpsMax-2 {
		return 0, fmt.Errorf("%w: %d extra conditions", ErrInvalid, len(extra))
	}
	tk, pk := c.keys.table(table), c.keys.part(table, part)
	cmps := append([]clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(tk), "=", created),
		clientv3.Compare(clientv3.ModRevision(pk), "=", rev),
	}, extra...)
	resp, err := c.cli.Txn(ctx).If(cmps...).Then(clientv3.OpPut(pk, string(encodePartition(to)))).
		Else(clientv3.OpGet(tk, clientv3.WithCountOnly())).Commit()
	if err != nil {
		return 0, unavailable(fmt.Sprintf("switch table %q partition %d", table, part), err)
	}
	if !resp.Succeeded {
		if rr := resp.Responses[0].GetResponseRange(); rr != nil && rr.Count == 0 {
			return 0, fmt.Errorf("%w: %q", ErrTableNotFound, table)
		}
		return 0, fmt.Errorf("%w: table %q partition %d is no longer at revision %d", ErrMapChanged, table, part, rev)
	}
	return resp.Header.Revision, nil
}

// mapState is the raw partition map as read from etcd: table entries and partition entries
// by table, which snapshot turns into a Map. One goroutine at a time.
type mapState struct {
	tables map[string]tableEntry
	parts  map[string]map[uint32]partEntry
	// bad holds, by table, the keys of the table whose value failed to decode, with why:
	// the table is broken while any is (each key's own later put or delete clears it).
	bad map[string]map[string]error
}

type tableEntry struct {
	layout  Layout
	created int64
}

type partEntry struct {
	addr string
	rev  int64
}

func (s *mapState) init() {
	s.tables = make(map[string]tableEntry)
	s.parts = make(map[string]map[uint32]partEntry)
	s.bad = make(map[string]map[string]error)
}

// setBad records (err non-nil) or clears the decode failure of key of table name.
func (s *mapState) setBad(name, key string, err error) {
	kb := s.bad[name]
	if err == nil {
		delete(kb, key)
		if len(kb) == 0 {
			delete(s.bad, name)
		}
		return
	}
	if kb == nil {
		kb = make(map[string]error)
		s.bad[name] = kb
	}
	kb[key] = err
}

// put applies a put of key (under the map prefix). A value that fails to decode marks its
// table broken until that key is written with a good value or deleted.
func (s *mapState) put(k keys, key string, val []byte, created, mod int64) {
	switch {
	case strings.HasPrefix(key, k.tablePrefix()):
		name := key[len(k.tablePrefix()):]
		l, err := decodeTable(val)
		if err != nil {
			s.setBad(name, key, fmt.Errorf("table %q: %w", name, err))
			delete(s.tables, name)
			return
		}
		s.setBad(name, key, nil)
		s.tables[name] = tableEntry{layout: l, created: created}
	case strings.HasPrefix(key, k.partPrefix()):
		name, p, err := parseTablePart(key[len(k.partPrefix()):])
		if err != nil {
			return // not a key of ours: nothing to name it by
		}
		addr, err := decodePartition(val)
		if err != nil {
			s.setBad(name, key, fmt.Errorf("table %q partition %d: %w", name, p, err))
			s.delPart(name, p)
			return
		}
		s.setBad(name, key, nil)
		ps := s.parts[name]
		if ps == nil {
			ps = make(map[uint32]partEntry)
			s.parts[name] = ps
		}
		ps[p] = partEntry{addr: addr, rev: mod}
	}
}

// del applies a delete of key.
func (s *mapState) del(k keys, key string) {
	switch {
	case strings.HasPrefix(key, k.tablePrefix()):
		name := key[len(k.tablePrefix()):]
		delete(s.tables, name)
		s.setBad(name, key, nil)
	case strings.HasPrefix(key, k.partPrefix()):
		name, p, err := parseTablePart(key[len(k.partPrefix()):])
		if err != nil {
			return
		}
		s.setBad(name, key, nil)
		s.delPart(name, p)
	}
}

// delPart forgets partition p's entry of table name.
func (s *mapState) delPart(name string, p uint32) {
	if ps := s.parts[name]; ps != nil {
		delete(ps, p)
		if len(ps) == 0 {
			delete(s.parts, name)
		}
	}
}

// snapshot builds the Map of the state at revision rev.
func (s *mapState) snapshot(rev int64) *Map {
	m := &Map{Revision: rev, Tables: make(map[string]*TableMap, len(s.tables)), Broken: make(map[string]error)}
	for name, kb := range s.bad {
		// The first bad key in key order: the same error for the same state.
		ks := slices.Sorted(maps.Keys(kb))
		m.Broken[name] = kb[ks[0]]
	}
	for name, te := range s.tables {
		if m.Broken[name] != nil {
			continue
		}
		ps := s.parts[name]
		n := int(te.layout.Partitions)
		if len(ps) != n {
			m.Broken[name] = fmt.Errorf("cluster: table %q: %d partition entries for %d partitions", name, len(ps), n)
			continue
		}
		t := &TableMap{Name: name, Layout: te.layout, Created: te.created, Nodes: make([]string, n), Revs: make([]int64, n)}
		ok := true
		for p, e := range ps {
			if p >= uint32(n) {
				ok = false
				break
			}
			t.Nodes[p], t.Revs[p] = e.addr, e.rev
		}
		if !ok {
			m.Broken[name] = fmt.Errorf("cluster: table %q: a partition entry beyond its %d partitions", name, n)
			continue
		}
		m.Tables[name] = t
	}
	return m
}

// StorageNodes lists, once each, the addresses of the storage nodes the partition map names
// (every partition entry's, of complete tables or not): a linearizable read of the whole map.
// A storage node's two-phase commit resolver dials only these (server.PeerDirectory;
// docs/cluster.md, "Peers").
func (c *Client) StorageNodes(ctx context.Context) ([]string, error) {
	_, st, err := c.readMapState(ctx)
	if err != nil {
		return nil, err
	}
	seen := make(map[string]bool)
	var nodes []string
	for _, ps := range st.parts {
		for _, e := range ps {
			if !seen[e.addr] {
				seen[e.addr] = true
				nodes = append(nodes, e.addr)
			}
		}
	}
	slices.Sort(nodes)
	return nodes, nil
}
