package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// mayCreateCluster checks a CreateClusterTable: a client's is allowed only when etcd's
// partition map places the partition on this node (storenode's VerifyClusterCreate, "this
// node" being the address the server listens on, as for a move step); an operator's (the
// mover's target of a move) is not checked. Refused: sgio.ErrForbidden.
func (s *session) mayCreateCluster(m *sgio.CreateClusterTable) error {
	if s.role&roleOperator != 0 {
		return nil
	}
	err := s.srv.eng.VerifyClusterCreate(context.Background(), m.Name, m.Layout.Partition, s.srv.moveSelf(), s.id)
	if errors.Is(err, storenode.ErrFenced) {
		return fmt.Errorf("storenode: %v: creating it here is an operator's request: %w", err, sgio.ErrForbidden)
	}
	return err
}

// dropTable drops table name for the session: as its owner (storenode's DropTable), and for
// an operator, when that is refused because the table is a cluster table, as a partition
// table etcd's map does not place here (DropMisplacedTable): a client's copy left on the
// wrong node is not kept for the table's life.
func (s *session) dropTable(name string) error {
	e := s.srv.eng
	err := e.DropTable(name, s.owner)
	if err == nil || s.role&roleOperator == 0 || !errors.Is(err, storenode.ErrTableOwned) {
		return err
	}
	err2 := e.DropMisplacedTable(context.Background(), name, s.srv.moveSelf(), s.id)
	if errors.Is(err2, storenode.ErrNoVerifier) {
		return err // this node cannot say where the map places it: DropTable's answer
	}
	return err2
}
