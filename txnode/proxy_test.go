package txnode

import (
	"net"
	"sync"
)

// acceptPairs is the accept loop of the tests' TCP proxies: for each connection accepted on
// ln it dials target and hands both ends to pair (client side, node side). It runs until ln
// is closed, counted in wg.
func acceptPairs(ln net.Listener, target string, wg *sync.WaitGroup, pair func(c, s net.Conn)) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			pair(c, s)
		}
	}()
}
