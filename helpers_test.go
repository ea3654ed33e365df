package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"toron/internal/testnet"
)

// The set-ups of the process-level tests: the binary run to its end, started and waited for,
// stopped by SIGTERM; the shared waits poll generously (a loaded machine runs these).

// runBinary runs the binary with args to its end, with env added to the environment, and
// returns its exit code, stdout and stderr.
func runBinary(env []string, args ...string) (code int, stdout, stderr string) {
	cmd := exec.Command(binPath, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	return exitCode(cmd.Run()), out.String(), errOut.String()
}

// startCmd starts cmd (the binary) with its stderr collected, kills it when the test ends and
// waits until it answers /health on port. It returns the stderr and the base URL.
func startCmd(t testing.TB, cmd *exec.Cmd, port int) (*testnet.Buffer, string) {
	t.Helper()
	stderr := &testnet.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHealthy(t, base)
	return stderr, base
}

// startDemo starts the binary with a demo flag and env added to the environment; it returns
// the process, killed when the test ends, and its stdout (the banner).
func startDemo(t *testing.T, flag string, env ...string) (*exec.Cmd, io.Reader) {
	t.Helper()
	cmd := exec.Command(binPath, flag)
	cmd.Env = append(append(os.Environ(), "TORON_SERVER__DRAIN_DELAY=0s", "TORON_LOG__ACCESS=false"), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopGracefully(cmd) })
	return cmd, stdout
}

// stopGracefully stops a demo process with SIGTERM, so that it closes what it started (its
// upstreams, its redis-server), and kills it when it has not exited within 10 s.
func stopGracefully(cmd *exec.Cmd) {
	if cmd.ProcessState != nil {
		return // waited for already
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _, _ = cmd.Process.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// exited returns the channel cmd's Wait result arrives on.
func exited(cmd *exec.Cmd) <-chan error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return done
}

// waitExit0 fails the test unless the process behind done exits 0 within 15 s (within, when
// given); stderr (nil when not collected) goes into the failure.
func waitExit0(t *testing.T, done <-chan error, stderr fmt.Stringer, within ...time.Duration) {
	t.Helper()
	d := 15 * time.Second
	if len(within) > 0 {
		d = within[0]
	}
	select {
	case err := <-done:
		if code := exitCode(err); code != 0 {
			t.Errorf("exit %d; stderr %s", code, text(stderr))
		}
	case <-time.After(d):
		t.Fatalf("gateway did not exit within %s; stderr %s", d, text(stderr))
	}
}

// stopBinary sends SIGTERM and fails the test unless the process exits 0 (waitExit0).
func stopBinary(t *testing.T, cmd *exec.Cmd, stderr fmt.Stringer) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitExit0(t, exited(cmd), stderr)
}

func text(s fmt.Stringer) string {
	if s == nil {
		return ""
	}
	return s.String()
}

// waitFor polls cond every 50 ms and fails the test, with the process's stderr, when it has
// not held within 10 s.
func waitFor(t *testing.T, stderr fmt.Stringer, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s; stderr:\n%s", what, text(stderr))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitLogged waits (waitFor) until stderr holds want.
func waitLogged(t *testing.T, stderr fmt.Stringer, want, what string) {
	t.Helper()
	waitFor(t, stderr, what, func() bool { return strings.Contains(stderr.String(), want) })
}

// statusOf returns the status of a GET of url; a failed request fails the test.
func statusOf(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// upstreamRoute is one upstream route of routes.yaml, prefix to http://addr.
func upstreamRoute(prefix, addr string) string {
	return fmt.Sprintf("  - type: upstream\n    prefix: %s\n    target: http://%s\n", prefix, addr)
}

// serverYAML is the config.yaml of a gateway on 127.0.0.1:port: the server lines given, then
// the log lines (each indented two spaces and ending in a newline).
func serverYAML(port int, server, log string) string {
	return fmt.Sprintf("server:\n  host: 127.0.0.1\n  port: %d\n%slog:\n%s", port, server, log)
}

// gatewayFiles are a test gateway's config.yaml and routes.yaml, in dir, for port.
type gatewayFiles struct {
	dir, config, routes string
	port                int
}

// writeGateway writes serverYAML(a free port, server, log) and routes into a temporary
// directory.
func writeGateway(t testing.TB, server, log, routes string) gatewayFiles {
	t.Helper()
	g := gatewayFiles{dir: t.TempDir(), port: testnet.FreePort(t)}
	g.config = writeFile(t, g.dir, "config.yaml", serverYAML(g.port, server, log))
	g.routes = writeFile(t, g.dir, "routes.yaml", routes)
	return g
}

// start starts the binary on the files (startBinary).
func (g gatewayFiles) start(t testing.TB) (*exec.Cmd, *testnet.Buffer, string) {
	t.Helper()
	return startBinary(t, g.config, g.routes, g.port)
}

// startGateway writes the files (writeGateway) and starts the binary on them.
func startGateway(t testing.TB, server, log, routes string) (*exec.Cmd, *testnet.Buffer, string) {
	t.Helper()
	return writeGateway(t, server, log, routes).start(t)
}

// get returns the status and body of a GET of url through c (nil: http.DefaultClient); a
// failed request fails the test.
func get(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}
