package gateway

import (
	"bufio"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"toron/internal/testnet"
)

// TCP states of /proc/net/tcp (include/net/tcp_states.h).
const (
	tcpEstablished = 0x01
	tcpCloseWait   = 0x08
)

// loopbackSockets calls f with the state, the local and remote ports and the receive queue of
// every IPv4 TCP socket of the machine (/proc/net/tcp): the test's way to wait for an event
// inside the kernel (a FIN that arrived, bytes that were sent) instead of sleeping.
func loopbackSockets(t *testing.T, f func(state, localPort, remotePort int, rxQueue int64)) {
	t.Helper()
	file, err := os.Open("/proc/net/tcp")
	if err != nil {
		t.Skipf("no /proc/net/tcp: %v", err)
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		port := func(addr string) int {
			_, p, _ := strings.Cut(addr, ":")
			n, _ := strconv.ParseInt(p, 16, 32)
			return int(n)
		}
		st, _ := strconv.ParseInt(fields[3], 16, 32)
		_, rx, _ := strings.Cut(fields[4], ":")
		q, _ := strconv.ParseInt(rx, 16, 64)
		f(int(st), port(fields[1]), port(fields[2]), q)
	}
}

// waitSocket waits (up to 5 s) until some socket satisfies cond.
func waitSocket(t *testing.T, what string, cond func(state, localPort, remotePort int, rxQueue int64) bool) {
	t.Helper()
	waitSocketFound(t, what, true, cond)
}

// waitNoSocket waits up to 5 s until no loopback socket matches cond.
func waitNoSocket(t *testing.T, what string, cond func(state, localPort, remotePort int, rxQueue int64) bool) {
	t.Helper()
	waitSocketFound(t, what, false, cond)
}

// waitSocketFound waits up to 5 s until whether some loopback socket matches cond is found.
func waitSocketFound(t *testing.T, what string, found bool, cond func(state, localPort, remotePort int, rxQueue int64) bool) {
	t.Helper()
	if !testnet.WaitUntil(5*time.Second, func() bool {
		seen := false
		loopbackSockets(t, func(st, lp, rp int, q int64) { seen = seen || cond(st, lp, rp, q) })
		return seen == found
	}) {
		t.Fatalf("waited 5 s for %s", what)
	}
}

func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return n
}
