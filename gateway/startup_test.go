package gateway

import (
	"testing"
)

// TestServeKeepsAReloadMadeBeforeIt: a reload handled between New and Serve (main catches
// SIGHUP before the port opens) stays in force; Serve used to store the snapshot of New again,
// undoing it, and to size the bulkheads only then.
func TestServeKeepsAReloadMadeBeforeIt(t *testing.T) {
	up := startUpstream(t, nil)
	g, err := New(loadConfig(t, "", upstreamRoute("/a", up.addr, "name: a\nmax_concurrency: 3")), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The bulkheads are sized by New already.
	if got := g.stats.get("a").bulkhead.Max(); got != 3 {
		t.Errorf("bulkhead of a after New: %d, want 3", got)
	}
	next := loadConfig(t, "", upstreamRoute("/b", up.addr, "name: b\nmax_concurrency: 2"))
	if err := g.Reload(next); err != nil {
		t.Fatal(err)
	}
	addr := serveGateway(t, g)
	// Serve has started once the listener answers.
	if s, _, _, err := getStatus(addr, "/b/x"); err != nil || s != 200 {
		t.Errorf("route b of the reload: %d %v, want 200", s, err)
	}
	if g.Config() != next {
		t.Errorf("Serve put the configuration of New back in force over the reload")
	}
}
