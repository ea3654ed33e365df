package main

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// vegeta's attacker owns its http.Transport and offers no way to close its idle
		// keep-alive connections: their loops end when the process does.
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		// fasthttp's server worker-pool cleaner sleeps out its period after Shutdown; its
		// date updater lives for the process.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		// The naive proxy's client: fasthttp's default dialer caches addresses for the process,
		// and a HostClient's cleaner sleeps out its period after its last connection closed.
		goleak.IgnoreTopFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
	)
}

func TestValidateKeepsTrafficOnLoopback(t *testing.T) {
	base := options{scenario: "probe", peer: "toron", bulkhead: 8, duration: time.Second, rounds: 3, uploads: 8,
		connections: 1, apiRate: 1, healthRate: 1, interval: time.Millisecond, probeTimeout: time.Second}
	for target, ok := range map[string]bool{
		"":                           true,
		"http://127.0.0.1:8080":      true,
		"http://localhost:8080/":     true,
		"http://10.0.0.1:8080":       false,
		"http://192.168.1.2":         false,
		"http://example.com":         false,
		"https://127.0.0.1:8443":     false,
		"http://127.0.0.1.nip.io:80": false,
	} {
		o := base
		o.target = target
		if err := o.validate(); (err == nil) != ok {
			t.Errorf("target %q: validate() = %v, want ok=%v", target, err, ok)
		}
	}
	o := base
	o.scenario = "nope"
	if err := o.validate(); err == nil {
		t.Error("an unknown scenario passed validation")
	}
}

func TestValidatePeer(t *testing.T) {
	base := options{scenario: "isolation", peer: "toron", bulkhead: 8, duration: time.Second, rounds: 3, uploads: 8,
		connections: 1, apiRate: 1, healthRate: 1, interval: time.Millisecond, probeTimeout: time.Second}
	for _, c := range []struct {
		scenario, peer string
		ok             bool
	}{
		{"isolation", "toron", true},
		{"isolation", "nginx", true},
		{"isolation", "haproxy", false},
		{"small-get", "nginx", false},
		{"slow-client", "nginx", false},
	} {
		o := base
		o.scenario, o.peer = c.scenario, c.peer
		if err := o.validate(); (err == nil) != c.ok {
			t.Errorf("-scenario %s -peer %s: validate() = %v, want ok=%v", c.scenario, c.peer, err, c.ok)
		}
	}
	o := base
	o.bulkhead = 0
	if err := o.validate(); err == nil {
		t.Error("-bulkhead 0 passed validation")
	}
}
