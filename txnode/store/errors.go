package store

import (
	"errors"
	"fmt"

	"github.com/weftdb/weft/storenode"
)

// ErrClosed is wrapped by the error of every call a store answers after its Close, from
// both stores; it is txnode.ErrClosed (which is why it reads "txnode: "), so a game's
// errors.Is(err, txnode.ErrClosed) holds for a call that raced DB.Close into the store as for
// one that came after it. The embedded store's error wraps storenode.ErrClosed too.
var ErrClosed = errors.New("txnode: closed")

// closedErr makes an engine's "closed" error wrap ErrClosed; any other error, and nil, it
// returns as it is.
func closedErr(err error) error {
	if err != nil && errors.Is(err, storenode.ErrClosed) && !errors.Is(err, ErrClosed) {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return err
}
