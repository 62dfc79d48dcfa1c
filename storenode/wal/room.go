package wal

// Room returns a channel that is closed when the writer next takes the queue, making room for
// an appender that AppendAsync turns away with ErrBusy. Take the channel BEFORE calling
// AppendAsync: if the writer takes the queue in between, the channel is already closed, so
// waiting on it cannot miss the wake-up. Any goroutine may call it.
func (w *WAL) Room() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.spaceWatched = true
	return w.spaceFreed
}
