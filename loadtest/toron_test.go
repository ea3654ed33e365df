package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGeneratedFilesPassCheck validates the generated config and routes with the gateway's
// -check. The gateway is built here from the module root: make test never builds bin/toron, so
// relying on it made the test skip on every CI run.
func TestGeneratedFilesPassCheck(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "toron")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the gateway: %v\n%s", err, out)
	}
	cfg, routes := filepath.Join(dir, "config.yaml"), filepath.Join(dir, "routes.yaml")
	if err := writeTemplate(cfg, configTemplate, map[string]int{"Port": 18999}); err != nil {
		t.Fatal(err)
	}
	if err := writeTemplate(routes, routesTemplate, RouteOptions{Upstream: "127.0.0.1:18998", ReportsMaxConcurrency: 8}); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-check", "-config", cfg, "-routes", routes).CombinedOutput()
	if err != nil {
		t.Fatalf("toron -check refused the generated files: %v\n%s", err, out)
	}
	for _, want := range []string{`"api"`, `"reports"`, `"upload"`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("-check output lacks route %s", want)
		}
	}
}
