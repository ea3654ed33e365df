package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestK6ScriptsParse checks the syntax of every k6 script with node: k6 cannot be installed
// here, and its scripts are ES modules (import http from 'k6/http'), which node checks as
// such only with the .mjs extension. The imports are not resolved, only parsed.
func TestK6ScriptsParse(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: cannot check the k6 scripts")
	}
	scripts, err := filepath.Glob(filepath.Join("k6", "*.js"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"small-get", "upload", "isolation", "slow-client"} {
		if _, err := os.Stat(filepath.Join("k6", want+".js")); err != nil {
			t.Errorf("no k6 script for the %s scenario: %v", want, err)
		}
	}
	dir := t.TempDir()
	for _, s := range scripts {
		src, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(src), "from 'k6/http'") {
			t.Errorf("%s does not import k6/http", s)
		}
		mjs := filepath.Join(dir, filepath.Base(s)+".mjs")
		if err := os.WriteFile(mjs, src, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(node, "--check", mjs).CombinedOutput(); err != nil {
			t.Errorf("%s: node --check: %v\n%s", s, err, out)
		}
	}
}
