package bench

import (
	"fmt"
	"net"
	"strings"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/weftdb/weft/cluster/local"
)

// --cluster runs a single-member etcd inside this process (go.etcd.io/etcd/server/v3/embed),
// its data in a temporary directory, on two free loopback ports, its log off. It stores only
// the cluster's coordination state (the partition map, the ownership leases); the benchmark's
// ops do not touch it (a storage node verifies a grant in etcd once, when a partition is
// taken). Its CPU time is this process's: it counts in the reported CPU us/op. The member is
// cluster/local's (StartEtcd), as `weft cluster up` runs it.

// benchEtcd is the in-process etcd of --cluster.
type benchEtcd struct {
	e        *embed.Etcd
	endpoint string
}

// startEtcd starts the member with its data in dir. The ports are picked by listening on :0
// and closing; another process may take one before etcd binds it, hence the retries.
func startEtcd(dir string) (*benchEtcd, error) {
	var err error
	for try := 0; try < 5; try++ {
		var cp, pp int
		if cp, err = freeLoopbackPort(); err != nil {
			continue
		}
		if pp, err = freeLoopbackPort(); err != nil {
			continue
		}
		var e *embed.Etcd
		if e, err = startEtcdOn(dir, cp, pp); err == nil {
			return &benchEtcd{e: e, endpoint: fmt.Sprintf("http://127.0.0.1:%d", cp)}, nil
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, fmt.Errorf("bench: start etcd: %w", err)
}

func startEtcdOn(dir string, clientPort, peerPort int) (*embed.Etcd, error) {
	return local.StartEtcd(dir, "crudbench", clientPort, peerPort)
}

// close stops the member (its clients are closed first by the caller).
func (b *benchEtcd) close() {
	b.e.Server.HardStop()
	b.e.Close()
}

func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
