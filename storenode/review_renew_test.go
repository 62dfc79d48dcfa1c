package storenode

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// After Close every call fails with ErrClosed (errors.go), renewals included: a closed engine
// renews no lease (its holder must not be told it may keep serving), whether asked through
// RenewGrant or Acquire with the grant's epoch; Renew extends nothing.
func TestRenewGrantAfterClose(t *testing.T) {
	now := fakeClock{}
	e := openTest(t, Options{Now: now.Now})
	info, err := e.CreateTable("t", 64)
	require.NoError(t, err)
	g, err := e.Acquire(info.ID, 1, 0)
	require.NoError(t, err)
	require.NoError(t, e.Close())

	_, err = e.RenewGrant(info.ID, 1, g.Epoch)
	require.ErrorIs(t, err, ErrClosed)
	_, err = e.Acquire(info.ID, 1, g.Epoch)
	require.ErrorIs(t, err, ErrClosed)

	now.Advance(DefaultLeaseDuration / 2)
	e.Renew(1)
	e.leaseMu.Lock()
	until := e.tables[info.ID].leaseUntil
	e.leaseMu.Unlock()
	require.False(t, until.After(now.Now().Add(DefaultLeaseDuration/2)), "Renew extended a lease of a closed engine")
}
