package node

// SetMoveStepHook sets the hook Move calls after each durable step (tests only).
func SetMoveStepHook(f func(step string)) { moveStepHook = f }

// SetCoordHook sets the two-phase commit's step hook (coordHook) for a test and returns
// what restores it. Set it before any transaction runs.
func SetCoordHook(h func(step string, i int)) (restore func()) {
	old := coordHook
	coordHook = h
	return func() { coordHook = old }
}

// SetSerialPrepares makes the two-phase commit prepare its participants one after another
// (coordSerialPrepares) and returns what restores it.
func SetSerialPrepares(on bool) (restore func()) {
	old := coordSerialPrepares
	coordSerialPrepares = on
	return func() { coordSerialPrepares = old }
}
