package main

import (
	"encoding/json"
	"strings"
	"testing"

	"toron/internal/dnstest"
)

// TestCheckListsDiscoveredAddresses: -check resolves a discover: dns entry through
// server.resolver and prints the addresses found; a name without any is a warning, not an
// error (SPEC 13).
func TestCheckListsDiscoveredAddresses(t *testing.T) {
	d := dnstest.New(t)
	d.Set("api.test", "10.1.0.7", "10.1.0.5", "fd00::9")
	dir := t.TempDir()
	cfg := writeFile(t, dir, "config.yaml", "server:\n  resolver: \""+d.Addr+"\"\n")
	routes := writeFile(t, dir, "routes.yaml", `routes:
  - type: upstream
    prefix: /api
    targets:
      - {url: "http://api.test:8080", discover: dns}
  - type: upstream
    prefix: /late
    targets:
      - {url: "http://late.test:8080", discover: dns}
`)
	code, stdout, stderr := runBinary(nil, "-check", "-config", cfg, "-routes", routes)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, stderr)
	}
	var doc struct {
		Routes []struct {
			Effective struct {
				Targets []struct {
					Addr     string   `json:"addr"`
					Discover string   `json:"discover"`
					Found    []string `json:"found"`
				} `json:"targets"`
				DiscoveryRefresh string `json:"discovery_refresh"`
			} `json:"effective"`
		} `json:"routes"`
	}
	if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, stdout)
	}
	got := doc.Routes[0].Effective.Targets[0]
	if got.Discover != "dns" || strings.Join(got.Found, " ") != "10.1.0.5:8080 10.1.0.7:8080 [fd00::9]:8080" {
		t.Fatalf("-check shows %+v, want the three addresses found", got)
	}
	if late := doc.Routes[1].Effective.Targets[0]; len(late.Found) != 0 {
		t.Fatalf("a name without records shows %v", late.Found)
	}
	if !strings.Contains(stderr, `warning: route "/late": late.test:8080 (discover: dns) has no address`) {
		t.Fatalf("no warning for the name without addresses; stderr:\n%s", stderr)
	}
}
