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
	base := options{scenario: "probe", peers: []string{"toron"}, bulkhead: 8, duration: time.Second, rounds: 3, uploads: 8,
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

func TestValidatePeers(t *testing.T) {
	base := options{scenario: "isolation", peers: []string{"toron"}, bulkhead: 8, duration: time.Second, rounds: 3, uploads: 8,
		connections: 1, apiRate: 1, healthRate: 1, interval: time.Millisecond, probeTimeout: time.Second}
	for _, c := range []struct {
		peers []string
		ok    bool
	}{
		{[]string{"toron"}, true},
		{[]string{"nginx"}, true},
		{[]string{"toron", "nginx", "haproxy"}, true},
		{[]string{"haproxy", "toron"}, true},
		{[]string{"envoy"}, false},
		{[]string{"toron", "toron"}, false},
		{[]string{""}, false},
	} {
		o := base
		o.peers = c.peers
		if err := o.validate(); (err == nil) != c.ok {
			t.Errorf("-peers %v: validate() = %v, want ok=%v", c.peers, err, c.ok)
		}
	}
	for _, c := range []struct {
		scenario string
		want     int
	}{{"isolation", isolationRounds}, {"upload", 3}} {
		o := base
		o.scenario, o.rounds = c.scenario, 0
		if err := o.validate(); err != nil || o.rounds != c.want {
			t.Errorf("-scenario %s without -rounds: %d rounds (%v), want %d", c.scenario, o.rounds, err, c.want)
		}
	}
	o := base
	o.bulkhead = 0
	if err := o.validate(); err == nil {
		t.Error("-bulkhead 0 passed validation")
	}
}

// TestValidateAuthFlood: auth-flood runs 5 rounds and /api open loop unless told otherwise.
func TestValidateAuthFlood(t *testing.T) {
	base := options{scenario: "auth-flood", peers: []string{"toron"}, bulkhead: 8, duration: time.Second, uploads: 8,
		connections: 1, apiRate: 1, apiConns: 8, healthRate: 1, interval: time.Millisecond, probeTimeout: time.Second}
	o := base
	if err := o.validate(); err != nil || o.rounds != authFloodRounds || o.apiConns != 0 {
		t.Errorf("auth-flood defaults: %d rounds, %d /api connections (%v), want %d and 0 (open loop)", o.rounds, o.apiConns, err, authFloodRounds)
	}
	o = base
	o.apiConnsSet = true
	if err := o.validate(); err != nil || o.apiConns != 8 {
		t.Errorf("auth-flood with -api-conns 8: %d connections (%v)", o.apiConns, err)
	}
}
