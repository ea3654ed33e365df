package main

import (
	"runtime"
	"testing"
)

func TestEnsureProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	noEnv := func(string) string { return "" }

	runtime.GOMAXPROCS(1)
	if n := ensureProcs(noEnv, 1); n != minProcs || runtime.GOMAXPROCS(0) != minProcs {
		t.Fatalf("one CPU: ensureProcs = %d, GOMAXPROCS %d; want %d", n, runtime.GOMAXPROCS(0), minProcs)
	}

	runtime.GOMAXPROCS(1)
	set := func(k string) string {
		if k == "GOMAXPROCS" {
			return "1"
		}
		return ""
	}
	if n := ensureProcs(set, 1); n != 1 || runtime.GOMAXPROCS(0) != 1 {
		t.Fatalf("GOMAXPROCS=1 set by the operator: ensureProcs = %d, GOMAXPROCS %d; want 1 kept", n, runtime.GOMAXPROCS(0))
	}

	// A CPU quota of one CPU on a machine of 8 (GOMAXPROCS 1 from the cgroup): kept.
	if n := ensureProcs(noEnv, 8); n != 1 || runtime.GOMAXPROCS(0) != 1 {
		t.Fatalf("quota of one CPU of 8: ensureProcs = %d, GOMAXPROCS %d; want 1 kept", n, runtime.GOMAXPROCS(0))
	}

	runtime.GOMAXPROCS(3)
	if n := ensureProcs(noEnv, 3); n != 3 {
		t.Fatalf("three CPUs: ensureProcs = %d, want 3 kept", n)
	}
}
