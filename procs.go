package main

import "runtime"

// minProcs is the fewest Ps (GOMAXPROCS) Toron runs with on a machine, or under a CPU
// affinity, of one CPU.
//
// Why: a proxy spends most of its time in system calls (writes to loopback or to the network
// deliver the bytes in the writer's own context), and on one CPU the kernel often preempts the
// gateway inside such a call to run the process it just woke (an upstream or a client on the
// same CPU). With a single P, Go's sysmon then finds that P "in a system call" and hands it to
// another thread, and the thread that returns from the call finds its P gone and sleeps: two
// thread switches for nothing. With a second P there is an idle P to take the work, and sysmon
// leaves the one in the call alone. Measured with Toron pinned to one core beside its upstream
// (the peer comparison's placement), 8 interleaved rounds: CPU per small GET 43.2 µs with 2 Ps
// against 55.1 µs with 1 (median), context switches per request 0.27 against 0.48-0.59, sysmon
// wake-ups halved; 4 Ps were no better than 2.
//
// Only when the process can run on one CPU (runtime.NumCPU, the affinity mask): there the two
// Ps never run at once. Under a CPU quota on a larger machine (a container limited to one CPU,
// where Go sizes GOMAXPROCS from the cgroup quota) two Ps would run in parallel, spend the
// quota twice as fast and be throttled for the rest of the period; the runtime's choice stands.
const minProcs = 2

// ensureProcs raises GOMAXPROCS to minProcs when the process can use a single CPU and the
// operator did not set GOMAXPROCS, and returns the value in force.
func ensureProcs(getenv func(string) string, numCPU int) int {
	n := runtime.GOMAXPROCS(0)
	if getenv("GOMAXPROCS") == "" && numCPU < minProcs && n < minProcs {
		runtime.GOMAXPROCS(minProcs)
		n = minProcs
	}
	return n
}
