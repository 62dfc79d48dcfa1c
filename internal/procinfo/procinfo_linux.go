package procinfo

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Bounds of a lookup: /proc/locks and /proc/net/tcp* lines read, processes scanned.
const (
	maxLines     = 1 << 16
	maxProcesses = 1 << 14
)

// FlockHolder returns the process that holds a flock on the file info describes, as
// /proc/locks lists it.
//   - A lock inherited by a child (a forked process keeps the descriptor) is listed under the
//     process that took it, which may have exited: the lookup then finds no live process.
func FlockHolder(info os.FileInfo) (Process, bool) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return Process{}, false
	}
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev)), st.Ino)
	var holder Process
	found := false
	scanLines("/proc/locks", func(line string) bool {
		// "1: FLOCK  ADVISORY  WRITE 12345 08:01:1234567 0 EOF"; a blocked waiter has "->".
		f := strings.Fields(line)
		if len(f) < 6 || f[1] != "FLOCK" || f[5] != want {
			return true
		}
		pid, err := strconv.Atoi(f[4])
		if err != nil || !alive(pid) {
			return true
		}
		holder, found = Process{PID: pid, Name: comm(pid)}, true
		return false
	})
	return holder, found
}

// ListenerHolder returns the process with a TCP socket listening on port, from the socket's
// inode in /proc/net/tcp or tcp6 and the descriptors of the processes this one may read.
func ListenerHolder(port int) (Process, bool) {
	inodes := map[string]bool{}
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		scanLines(file, func(line string) bool {
			// "sl local_address rem_address st ... uid timeout inode": state 0A is LISTEN.
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" {
				return true
			}
			_, hexPort, ok := strings.Cut(f[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); ok && err == nil && int(p) == port && f[9] != "0" {
				inodes["socket:["+f[9]+"]"] = true
			}
			return true
		})
	}
	if len(inodes) == 0 {
		return Process{}, false
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return Process{}, false
	}
	for i, p := range procs {
		if i >= maxProcesses {
			break
		}
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(filepath.Join("/proc", p.Name(), "fd"))
		if err != nil {
			continue // another user's, or gone
		}
		for _, fd := range fds {
			if link, err := os.Readlink(filepath.Join("/proc", p.Name(), "fd", fd.Name())); err == nil && inodes[link] {
				return Process{PID: pid, Name: comm(pid)}, true
			}
		}
	}
	return Process{}, false
}

func alive(pid int) bool {
	_, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid)))
	return err == nil
}

func comm(pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// scanLines calls fn for each of the first maxLines lines of file, until fn returns
// false; an unreadable file is no lines.
func scanLines(file string, fn func(line string) bool) {
	f, err := os.Open(file)
	if err != nil {
		return
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for n := 0; n < maxLines && s.Scan(); n++ {
		if !fn(s.Text()) {
			return
		}
	}
}
