package bench

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// processCPU returns the CPU time (user + system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// userHz is the unit of /proc/<pid>/stat's times (USER_HZ, 100 on every mainstream Linux).
const userHz = 100

// ProcessCPU returns the CPU time (user + system) process pid has used, from
// /proc/<pid>/stat, or 0 when it cannot be read.
func ProcessCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	return procStatCPU(string(b))
}

// procStatCPU parses the utime and stime of a /proc/<pid>/stat line.
func procStatCPU(s string) time.Duration {
	// The command name (field 2) is in parentheses and may hold spaces: fields after it.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(utime+stime) * time.Second / userHz
}

// loadAverage returns the 1, 5 and 15 minute load averages from /proc/loadavg ("0.52 0.61
// 0.70"), or "" when it cannot be read.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
