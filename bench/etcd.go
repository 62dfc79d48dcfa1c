package bench

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// --cluster runs a single-member etcd inside this process (go.etcd.io/etcd/server/v3/embed),
// its data in a temporary directory, on two free loopback ports, its log off. It stores only
// the cluster's coordination state (the partition map, the ownership leases); the benchmark's
// ops do not touch it (a storage node verifies a grant in etcd once, when a partition is
// taken). Its CPU time is this process's: it counts in the reported CPU us/op.

// etcdReadyTimeout bounds how long the start waits for the member to elect itself (seconds
// on a loaded 2-core machine).
const etcdReadyTimeout = time.Minute

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
	cu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", clientPort)}
	pu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}
	cfg := embed.NewConfig()
	cfg.Name = "crudbench"
	cfg.Dir = dir
	cfg.LogLevel = "fatal"
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ClusterState = embed.ClusterStateFlagNew
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	t := time.NewTimer(etcdReadyTimeout)
	defer t.Stop()
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("the member failed while starting: %w", err)
	case <-t.C:
		e.Close()
		return nil, errors.New("the member did not become ready in time")
	}
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
