package testkit

import (
	"net"
	"sync"
	"sync/atomic"
)

// FloodIdleSockets starts workers goroutines that each open connections with dial as fast
// as it succeeds and send nothing on them (a flood of idle sockets), each keeping its newest
// keep open and closing the oldest beyond. opened, when not nil, counts the connections
// opened. stop ends the flood: it closes every connection still held and returns once the
// goroutines have ended. Call stop once.
func FloodIdleSockets(workers, keep int, dial func() (net.Conn, error), opened *atomic.Int64) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var held []net.Conn
			defer func() {
				for _, c := range held {
					_ = c.Close()
				}
			}()
			for {
				select {
				case <-done:
					return
				default:
				}
				c, err := dial()
				if err != nil {
					continue
				}
				if opened != nil {
					opened.Add(1)
				}
				held = append(held, c)
				if len(held) > keep {
					_ = held[0].Close()
					held = held[1:]
				}
			}
		}()
	}
	return func() {
		close(done)
		wg.Wait()
	}
}
