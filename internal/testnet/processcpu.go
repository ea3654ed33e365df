package testnet

import (
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
