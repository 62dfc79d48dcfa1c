package node

import "github.com/weftdb/weft/cluster/internal/testhook"

// SetMoveStepHook sets the hook Move calls after each durable step (tests only).
func SetMoveStepHook(f func(step string)) { moveStepHook = f }

// SetCoordHook sets the two-phase commit's step hook (testhook.CoordStep) for a test and
// returns what restores it. Set it before any transaction runs.
func SetCoordHook(h func(step string, i int)) (restore func()) {
	old := testhook.CoordStep
	testhook.CoordStep = h
	return func() { testhook.CoordStep = old }
}

// SetSerialPrepares makes the two-phase commit prepare its participants one after another
// (coordSerialPrepares) and returns what restores it.
func SetSerialPrepares(on bool) (restore func()) {
	old := coordSerialPrepares
	coordSerialPrepares = on
	return func() { coordSerialPrepares = old }
}
