package bench

import (
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// TCPBytes returns the bytes sent (and acknowledged) plus received, per the kernel's TCP_INFO,
// on this process's TCP sockets connected to addr (host:port): the real traffic of a client
// library whose connections we do not own. Sockets closed meanwhile are not counted.
func TCPBytes(addr string) uint64 {
	ap, err := resolveAddrPort(addr)
	if err != nil {
		return 0
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	var total uint64
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		link, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil || !strings.HasPrefix(link, "socket:") {
			continue
		}
		sa, err := unix.Getpeername(fd)
		if err != nil || !peerIs(sa, ap) {
			continue
		}
		info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			continue
		}
		total += info.Bytes_acked + info.Bytes_received
	}
	return total
}

func resolveAddrPort(addr string) (netip.AddrPort, error) {
	ta, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return ta.AddrPort(), nil
}

func peerIs(sa unix.Sockaddr, want netip.AddrPort) bool {
	var got netip.AddrPort
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		got = netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		got = netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port))
	default:
		return false
	}
	return got.Addr().Unmap() == want.Addr().Unmap() && got.Port() == want.Port()
}
