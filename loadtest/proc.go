package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// What /proc tells about the processes of a run: children, CPU time, and the machine's CPU time
// spent by others (the machine is shared; a disturbed phase shows in the round's note).

// childPIDs lists the direct children of pid from /proc.
func childPIDs(pid int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []int
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// The command name is in parentheses and may hold spaces: the state and the parent's
		// pid follow the last ')'.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(b[i+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(pid) {
			continue
		}
		if child, err := strconv.Atoi(filepath.Base(filepath.Dir(f))); err == nil {
			out = append(out, child)
		}
	}
	return out
}

// cpuSample is the machine's CPU time (all cores, from /proc/stat) and that of the measuring
// processes (the load test itself, the server and its children) at one moment, in clock ticks.
type cpuSample struct {
	busy, steal, total, ours int64
}

// sampleCPU reads the machine's counters and the CPU time of the load test and of pids.
func sampleCPU(pids ...int) cpuSample {
	var s cpuSample
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		if len(f) >= 9 && f[0] == "cpu" {
			v := make([]int64, 9)
			for i := 1; i < 9; i++ {
				v[i], _ = strconv.ParseInt(f[i], 10, 64)
			}
			// user nice system idle iowait irq softirq steal
			s.busy = v[1] + v[2] + v[3] + v[6] + v[7]
			s.steal = v[8]
			s.total = s.busy + s.steal + v[4] + v[5]
		}
	}
	s.ours = procTicks(os.Getpid())
	for _, pid := range pids {
		s.ours += procTicks(pid)
	}
	return s
}

// otherCPU is the share of the machine (all cores, percent) that other processes used between
// two samples, and the share the hypervisor took (steal).
func otherCPU(from, to cpuSample) (other, steal float64) {
	total := float64(to.total - from.total)
	if total <= 0 {
		return 0, 0
	}
	other = 100 * float64((to.busy-from.busy)-(to.ours-from.ours)) / total
	return max(0, other), 100 * float64(to.steal-from.steal) / total
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat (100 on Linux).
const clockTicks = 100

// procTicks is utime + stime of a process (all its threads), 0 when unknown.
func procTicks(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	// After the command name: state (field 3) ... utime (14), stime (15).
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}

// disturbedCPU is the share of the machine taken by other processes above which a phase's
// latencies say more about them than about the server.
const disturbedCPU = 10

func disturbedText(otherMax float64) string {
	if otherMax > disturbedCPU {
		return fmt.Sprintf(" (WARNING: above %d%%, the rounds were disturbed: the p99 values measure the other processes too; rerun on a quiet machine)", disturbedCPU)
	}
	return ""
}

// loadAverage is the first three fields of /proc/loadavg, "?" when unknown.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// procStatusBytes reads a "kB" field of /proc/PID/status.
func procStatusBytes(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// treeStatusBytes sums a "kB" field of /proc/PID/status over pid and its direct children (a
// server's master and its workers).
func treeStatusBytes(pid int, field string) int64 {
	sum := procStatusBytes(pid, field)
	for _, c := range childPIDs(pid) {
		sum += procStatusBytes(c, field)
	}
	return sum
}

// procTicksOf is procTicks summed over pids.
func procTicksOf(pids []int) int64 {
	var n int64
	for _, pid := range pids {
		n += procTicks(pid)
	}
	return n
}
