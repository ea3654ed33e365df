package main

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"toron/conf"
	"toron/gateway"
	"toron/internal/testnet"
)

// startWatchingBinary is startBinary with -watch turned on by env (TORON_WATCH=1) or by flag.
func startWatchingBinary(t *testing.T, cfg, routes string, port int, byEnv bool) (*exec.Cmd, *testnet.Buffer, string) {
	t.Helper()
	cmd := exec.Command(binPath, "-config", cfg, "-routes", routes)
	if byEnv {
		cmd.Env = append(os.Environ(), "TORON_WATCH=1")
	} else {
		cmd.Args = append(cmd.Args, "-watch")
	}
	stderr, base := startCmd(t, cmd, port)
	return cmd, stderr, base
}

// metricValue reads one sample of /metrics, by its full name with labels; "" when absent.
func metricValue(t *testing.T, base, sample string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			return v
		}
	}
	return ""
}

// TestWatchKubeletSwapReloadsBinary: a real process started with TORON_WATCH=1 on a
// ConfigMap-style volume reloads on each ..data swap, as SIGHUP does: a new route is served;
// an invalid update is refused and counted while the old table keeps serving; the valid update
// after it is applied (the watch went on); the reload metrics are SIGHUP's.
func TestWatchKubeletSwapReloadsBinary(t *testing.T) {
	upAddr := startTestUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.URL.Path)
	})
	port := testnet.FreePort(t)
	serverYAML := serverYAML(port, "  drain_delay: 0s\n", "  access: false\n")
	route := func(prefix string) string { return upstreamRoute(prefix, upAddr) }
	k := &testnet.KubeVolume{Dir: t.TempDir()}
	k.Publish(t, map[string]string{"config.yaml": serverYAML, "routes.yaml": "routes:\n" + route("/a")})
	cmd, stderr, base := startWatchingBinary(t, filepath.Join(k.Dir, "config.yaml"), filepath.Join(k.Dir, "routes.yaml"), port, true)

	status := func(path string) int { return statusOf(t, base+path) }
	waitFor := func(what string, cond func() bool) { t.Helper(); waitFor(t, stderr, what, cond) }
	if status("/b/x") != 404 {
		t.Fatal("route /b exists before the update")
	}

	k.Publish(t, map[string]string{"config.yaml": serverYAML, "routes.yaml": "routes:\n" + route("/a") + route("/b")})
	waitFor("route /b not served after the ..data swap", func() bool { return status("/b/x") == 200 })

	k.Publish(t, map[string]string{"config.yaml": serverYAML, "routes.yaml": "routes:\n  - type: upstream\n    prefix: nope\n    target: http://x\n"})
	waitFor("invalid update not counted", func() bool { return metricValue(t, base, "toron_config_reload_errors_total") == "1" })
	// The count and the log line are two writes: wait for the line too.
	waitFor("invalid update not logged as refused", func() bool { return strings.Contains(stderr.String(), "reload refused") })
	if status("/a/x") != 200 || status("/b/x") != 200 {
		t.Error("old configuration stopped serving after an invalid update")
	}

	k.Publish(t, map[string]string{"config.yaml": serverYAML, "routes.yaml": "routes:\n" + route("/c")})
	waitFor("route /c not served after the valid update that followed the invalid one", func() bool { return status("/c/x") == 200 })
	if status("/a/x") != 404 {
		t.Error("route /a still served after the update that removed it")
	}
	if got := metricValue(t, base, "toron_config_reloads_total"); got != "2" {
		t.Errorf("toron_config_reloads_total %q, want 2", got)
	}
	if got := metricValue(t, base, "toron_config_reload_errors_total"); got != "1" {
		t.Errorf("toron_config_reload_errors_total %q, want 1", got)
	}
	stopBinary(t, cmd, stderr)
}

// TestWatchRenameOverReloadsBinary: with -watch, plain files replaced by a rename reload the
// gateway; a rewrite with the same bytes does not count as a reload.
func TestWatchRenameOverReloadsBinary(t *testing.T) {
	upAddr := startTestUpstream(t, func(w http.ResponseWriter, r *http.Request) {})
	routesYAML := func(prefix string) string { return "routes:\n" + upstreamRoute(prefix, upAddr) }
	g := writeGateway(t, "  drain_delay: 0s\n", "  access: false\n", routesYAML("/a"))
	dir, routes := g.dir, g.routes
	cmd, stderr, base := startWatchingBinary(t, g.config, routes, g.port, false)
	renameOver := func(name, content string) {
		t.Helper()
		tmp := writeFile(t, dir, "."+name+".swp", content)
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}

	same, err := os.ReadFile(g.config)
	if err != nil {
		t.Fatal(err)
	}
	renameOver("config.yaml", string(same)) // same bytes: no reload
	renameOver("routes.yaml", routesYAML("/z"))
	waitFor(t, stderr, "route /z not served after the rename", func() bool { return statusOf(t, base+"/z/x") == 200 })
	time.Sleep(1500 * time.Millisecond) // any second reload would have happened by now
	if got := metricValue(t, base, "toron_config_reloads_total"); got != "1" {
		t.Errorf("toron_config_reloads_total %q, want 1 (the same-content rewrite is no reload)", got)
	}
	if !strings.Contains(stderr.String(), `"files":["`+routes+`"]`) {
		t.Errorf("the reload does not log the changed file alone; stderr:\n%s", stderr.String())
	}
	stopBinary(t, cmd, stderr)
}

// TestWatchEnvInvalidExits2: TORON_WATCH takes true or 1 (false, 0); a typo is a one-line
// mistake, exit 2, not silently off.
func TestWatchEnvInvalidExits2(t *testing.T) {
	code, _, out := runBinary([]string{"TORON_WATCH=yes please"}, "-check")
	if code != 2 {
		t.Fatalf("exit %d, want 2; stderr %s", code, out)
	}
	if strings.Count(out, "\n") != 1 || !strings.Contains(out, "TORON_WATCH") {
		t.Errorf("want one line naming TORON_WATCH, got %q", out)
	}
}

// reloadOnRename builds a gateway from o, watches its files (watchedFiles) and extra, moves
// content over file by a rename and hands the one reported change to reloadOnChange, as main's
// select case does; it returns the gateway's metrics after the reload.
func reloadOnRename(t *testing.T, o options, extra []string, file, content string) string {
	t.Helper()
	load := func() (*conf.Config, error) { return conf.Load(o.config, o.routes, nil) }
	cfg, err := load()
	if err != nil {
		t.Fatal(err)
	}
	g, err := gateway.New(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	w, err := conf.NewWatcher(append(watchedFiles(o, cfg), extra...), func(err error) { t.Errorf("watch: %v", err) })
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	tmp := writeFile(t, filepath.Dir(file), "."+filepath.Base(file)+".new", content)
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
	select {
	case files := <-w.Changes():
		if len(files) != 1 || files[0] != file {
			t.Fatalf("changed %v, want [%s]", files, file)
		}
		reloadOnChange(files, w, o, g, load, zap.NewNop(), zap.NewAtomicLevel(), "json")
	case <-time.After(5 * time.Second):
		t.Fatalf("the change of %s was not reported", file)
	}
	var b bytes.Buffer
	g.Metrics().WritePrometheus(&b)
	return b.String()
}

// TestWatchThirdFileReloads: a watched file that is neither the config nor the routes (a
// stand-in for the certificate files main will list) changing leads, through the watcher and
// reloadOnChange (main's select case), to a reload of a real gateway, counted as SIGHUP's.
func TestWatchThirdFileReloads(t *testing.T) {
	dir, certDir := t.TempDir(), t.TempDir()
	o := options{
		config: writeFile(t, dir, "config.yaml", "server:\n  host: 127.0.0.1\n  port: 1\nlog:\n  access: false\n"),
		routes: writeFile(t, dir, "routes.yaml", "routes:\n"+upstreamRoute("/a", "127.0.0.1:1")),
	}
	cert := writeFile(t, certDir, "tls.crt", "certificate 1\n")
	metrics := reloadOnRename(t, o, []string{cert}, cert, "certificate 2\n")
	for _, want := range []string{"toron_config_reloads_total 1\n", "toron_config_reload_errors_total 0\n"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestWatchUsersFileReloads: -watch watches the users file of a basic-auth route (SPEC 18,
// SPEC 19): a new one reloads the gateway, which re-reads it.
func TestWatchUsersFileReloads(t *testing.T) {
	dir, authDir := t.TempDir(), t.TempDir()
	const line = "demo:$2a$10$jg/bnlbmcXdL6pyibpgETuY8f07GDz78V9OQLcMfECNyzfdKeTSZ.\n"
	users := writeFile(t, authDir, "users.htpasswd", line)
	o := options{
		config: writeFile(t, dir, "config.yaml", "server:\n  host: 127.0.0.1\n  port: 1\nlog:\n  access: false\n"),
		routes: writeFile(t, dir, "routes.yaml", "routes:\n"+upstreamRoute("/a", "127.0.0.1:1")+"    auth: {basic: {users_file: \""+users+"\"}}\n"),
	}
	cfg, err := conf.Load(o.config, o.routes, nil)
	if err != nil {
		t.Fatal(err)
	}
	if files := watchedFiles(o, cfg); !slices.Contains(files, users) {
		t.Fatalf("watched %v, want the users file too", files)
	}
	metrics := reloadOnRename(t, o, nil, users, line+"other:$2a$10$jg/bnlbmcXdL6pyibpgETuY8f07GDz78V9OQLcMfECNyzfdKeTSZ.\n")
	if !strings.Contains(metrics, "toron_config_reloads_total 1\n") {
		t.Error("no reload counted")
	}
}
