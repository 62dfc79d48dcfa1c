package server

import (
	"errors"
	"net"
	"strconv"
	"syscall"

	"github.com/weftdb/weft/internal/procinfo"
)

// listenHolder names, for the error of a listen refused because the address is in use, the
// process that listens there, where the operating system tells ("" otherwise): a node
// started with `go run` and its go command killed keeps the port (docs/operations.md).
func listenHolder(addr string, err error) string {
	if !errors.Is(err, syscall.EADDRINUSE) {
		return ""
	}
	_, portText, splitErr := net.SplitHostPort(addr)
	port, convErr := strconv.Atoi(portText)
	if splitErr != nil || convErr != nil {
		return ""
	}
	return procinfo.HeldBy(procinfo.ListenerHolder(port))
}
