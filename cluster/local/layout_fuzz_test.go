package local

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParseLayout: any bytes in cluster.json are refused or give a layout a start can use
// (ports in range and distinct, 1..StorageNodesMax storage nodes) that encodes back to
// itself.
func FuzzParseLayout(f *testing.F) {
	f.Add([]byte(`{"etcd_client_port": 2379, "etcd_peer_port": 2380, "storage_node_ports": [7070, 7071, 7072]}`))
	f.Add([]byte(`{"etcd_client_port": 1, "etcd_peer_port": 1, "storage_node_ports": [2]}`))
	f.Add([]byte(`{"storage_node_ports": []}`))
	f.Add([]byte(`{"etcd_client_port": 70000}`))
	f.Add([]byte(`not json`))
	f.Add([]byte(`{"etcd_client_port": 2379, "etcd_peer_port": 2380, "storage_node_ports": [7070], "etcd_prefix": "/game/"}`))
	f.Add([]byte(`{"etcd_client_port": 2379, "etcd_peer_port": 2380, "storage_node_ports": [7070], "etcd_prefix": "nope"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		lay, err := parseLayout(b)
		if err != nil {
			return
		}
		require.NotEmpty(t, lay.NodePorts)
		require.LessOrEqual(t, len(lay.NodePorts), StorageNodesMax)
		seen := map[int]bool{}
		for _, p := range append([]int{lay.EtcdClientPort, lay.EtcdPeerPort}, lay.NodePorts...) {
			require.True(t, p >= 1 && p <= 65535 && !seen[p], "port %d", p)
			seen[p] = true
		}
		enc, err := json.Marshal(lay)
		require.NoError(t, err)
		again, err := parseLayout(enc)
		require.NoError(t, err)
		require.Equal(t, lay, again)
	})
}

// TestLoadSecretRefusesOpenFile: a secret file group or others may read is refused, as
// cmd/storenode --secret-file does; a missing one is generated 0600 and read back alike.
func TestLoadSecretRefusesOpenFile(t *testing.T) {
	name := t.TempDir() + "/secret"
	s, err := loadSecret(name)
	require.NoError(t, err)
	again, err := loadSecret(name)
	require.NoError(t, err)
	require.Equal(t, s, again)
	require.NoError(t, os.Chmod(name, 0o644))
	_, err = loadSecret(name)
	require.ErrorContains(t, err, "chmod 600")
}
