package main

import (
	"os"
	"os/exec"
	"slices"
	"testing"
)

func TestChildPIDsFindsAChild(t *testing.T) {
	cmd := exec.Command("sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Skip("cannot start sleep:", err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	if kids := childPIDs(os.Getpid()); !slices.Contains(kids, cmd.Process.Pid) {
		t.Fatalf("childPIDs(%d) = %v, lacks %d", os.Getpid(), kids, cmd.Process.Pid)
	}
}

func TestOtherCPU(t *testing.T) {
	from := cpuSample{busy: 1000, steal: 10, total: 4000, ours: 300}
	// 400 ticks of the machine passed: 200 busy, of which ours 150; 20 stolen.
	to := cpuSample{busy: 1200, steal: 30, total: 4400, ours: 450}
	other, steal := otherCPU(from, to)
	if other != 12.5 || steal != 5 {
		t.Errorf("otherCPU = %.2f%%, steal %.2f%%; want 12.5%%, 5%%", other, steal)
	}
	// Our processes' counters may run ahead of the machine's by a tick: never below 0.
	if other, _ := otherCPU(from, cpuSample{busy: 1010, total: 4100, ours: 320}); other != 0 {
		t.Errorf("otherCPU = %.2f%%, want 0", other)
	}
	if other, steal := otherCPU(from, from); other != 0 || steal != 0 {
		t.Errorf("otherCPU over no time = %.2f, %.2f; want 0, 0", other, steal)
	}
	s := sampleCPU()
	if s.total <= 0 || s.busy <= 0 {
		t.Errorf("sampleCPU() = %+v: no machine counters read from /proc/stat", s)
	}
}
