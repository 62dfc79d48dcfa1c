package node

// SetMoveStepHook sets the hook Move calls after each durable step (tests only).
func SetMoveStepHook(f func(step string)) { moveStepHook = f }
