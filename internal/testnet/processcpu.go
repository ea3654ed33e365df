package testnet

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ProcessCPU is the process's user and system CPU time so far (0 when the kernel does not
// tell): a benchmark on a shared machine reports what its own work took from two readings,
// whatever the wall clock says. Unlike CPUSeconds it takes no testing.TB, so that a reading
// inside a benchmark's loop costs only the system call.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ThreadsCPU is the CPU time that process pid's threads have run so far: the first field
// (nanoseconds) of each /proc/PID/task/TID/schedstat, summed. It reads another process's
// clock, a gateway binary's say, with no help from it. A thread that ended took its time with
// it (Go's threads rarely end).
func ThreadsCPU(pid int) (time.Duration, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		return 0, fmt.Errorf("no /proc/%d/task/*/schedstat", pid)
	}
	var sum time.Duration
	for _, p := range tasks {
		data, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended meanwhile
		}
		field, _, _ := strings.Cut(string(data), " ")
		ns, err := strconv.ParseInt(field, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q", p, data)
		}
		sum += time.Duration(ns)
	}
	return sum, nil
}

// RSSBytes is the resident set of process pid (0: this process), from the VmRSS line of
// /proc/PID/status.
func RSSBytes(pid int) (int64, error) {
	path := "/proc/self/status"
	if pid != 0 {
		path = fmt.Sprintf("/proc/%d/status", pid)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: VmRSS %q: %v", path, rest, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("%s: no VmRSS", path)
}
