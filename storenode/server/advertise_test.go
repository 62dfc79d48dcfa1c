package server

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The address the cluster names this node by, against which move steps and clients' cluster
// table creations are verified: Config.Advertise, else the listen address; a node on an
// unspecified address without Advertise has none (it refuses them: ErrNoVerifier). Fails
// on ff9f679: no Advertise, so a node listening on 0.0.0.0 could never move or take a
// client's cluster table.
func TestAdvertisedAddressIsTheClusterName(t *testing.T) {
	env := startServer(t)
	require.Equal(t, env.addr, env.srv.moveSelf(), "the listen address")
	env = startServer(t, func(c *Config) { c.Advertise = "store-a.example:7070" })
	require.Equal(t, "store-a.example:7070", env.srv.moveSelf())
	env = startServer(t, func(c *Config) { c.Listen = "0.0.0.0:0" })
	require.Empty(t, env.srv.moveSelf(), "0.0.0.0 names no node")
}
