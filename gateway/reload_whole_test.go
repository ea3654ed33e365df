package gateway

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"

	"toron/internal/testnet"
)

// TestFailedReloadLeavesEverythingServing (SPEC 18): a reload builds and checks everything
// (certificates, routes, pools) before it swaps any of it, so one that fails at any step leaves
// the old configuration serving, whole: the old certificate, the old route table and the old
// targets with their pools. Here the step that fails is the second route's upstream Set, after
// the certificates changed and the first route moved to another target.
func TestFailedReloadLeavesEverythingServing(t *testing.T) {
	for _, step := range []string{"upstream set", "auth file"} {
		t.Run(step, func(t *testing.T) { testFailedReload(t, step) })
	}
}

// testFailedReload: step is what fails, after the certificates changed and /one moved: the
// second route's upstream Set (a value only the gateway refuses), or its auth checker (its
// users file went away between the load and the build).
func testFailedReload(t *testing.T, step string) {
	pki := testnet.NewCA(t)
	_, certA, keyA := pki.IssueFiles(t, "certA", "127.0.0.1")
	_, certB, keyB := pki.IssueFiles(t, "certB", "127.0.0.1")
	u1, u2, u3 := startUpstream(t, nil), startUpstream(t, nil), startUpstream(t, nil)
	gw := startGateway(t, tlsServerYAML("", certA, keyA), upstreamRoute("/one", u1.addr, "")+upstreamRoute("/two", u2.addr, ""))
	client := httpsClient(pki.Pool, "127.0.0.1", true)
	if code, _, _ := get(t, client, "https://"+gw.addr+"/one/x"); code != 200 || u1.requests.Load() != 1 {
		t.Fatalf("before the reload: %d, u1 saw %d", code, u1.requests.Load())
	}

	users := filepath.Join(t.TempDir(), "users")
	writeUsers(t, users, "ops", "secret")
	cfg := loadConfig(t, tlsServerYAML("", certB, keyB), upstreamRoute("/one", u3.addr, "")+upstreamRoute("/two", u2.addr, fmt.Sprintf("auth: {basic: {users_file: %q}}", users)))
	switch step {
	case "upstream set":
		cfg.Routes[1].Effective.Retries = 99 // refused by upstream.NewSet, after /one was built
	case "auth file":
		if err := os.Remove(users); err != nil {
			t.Fatal(err)
		}
	}
	rerr := gw.g.Reload(cfg)
	if rerr == nil {
		t.Fatal("the reload was accepted")
	}
	t.Logf("refused: %v", rerr)

	c, err := tls.Dial("tcp", gw.addr, &tls.Config{RootCAs: pki.Pool, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	cn := c.ConnectionState().PeerCertificates[0].Subject.CommonName
	t.Logf("certificate presented after the refused reload: %s", cn)
	_ = c.Close()
	if cn != "certA" {
		t.Errorf("after the refused reload the gateway presents %s, want the old certA", cn)
	}
	for i := 0; i < 3; i++ {
		if code, body, _ := get(t, client, "https://"+gw.addr+"/one/x"); code != 200 {
			t.Errorf("after the refused reload /one answers %d %s", code, body)
		}
	}
	if n1, n3 := u1.requests.Load(), u3.requests.Load(); n1 != 4 || n3 != 0 {
		t.Errorf("after the refused reload /one went to the old target %d times and to the new one %d times, want 3 and 0", n1-1, n3)
	}
	if n := u1.conns.Load(); n != 1 {
		t.Errorf("the old target's pool was retired: %d upstream connections, want 1 kept alive", n)
	}
}

// TestReloadWithRedirectRoute: a redirect route has no targets and no Set; the reload's check
// of every route's Set must not refuse it.
func TestReloadWithRedirectRoute(t *testing.T) {
	up := startUpstream(t, nil)
	routes := `- {type: redirect, prefix: /old, to: "https://{host}/new{uri}"}` + "\n" + upstreamRoute("/api", up.addr, "")
	gw := startGateway(t, "", routes)
	if err := gw.g.Reload(loadConfig(t, "", routes)); err != nil {
		t.Fatalf("a reload with a redirect route was refused: %v", err)
	}
}

// TestShutdownBeforeServe: a Shutdown that comes before Serve had started (a test's cleanup
// on a loaded machine, a signal at start-up) still ends Serve: fasthttp's own Shutdown does
// nothing for a listener it does not know yet, and Serve would then accept forever.
func TestShutdownBeforeServe(t *testing.T) {
	g, err := New(loadConfig(t, "", upstreamRoute("/api", testnet.RefusedAddr(t), "")), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := shutdownThenServe(t, g, ln, g.Serve); err != nil {
		t.Errorf("Serve after Shutdown: %v, want nil", err)
	}
}

// TestShutdownBeforeServeRedirect: the same race on the HTTPS redirect listener: a ServeRedirect
// that starts after Shutdown returns instead of serving on.
func TestShutdownBeforeServeRedirect(t *testing.T) {
	_, c1, k1 := testnet.NewCA(t).IssueFiles(t, "gw", "gw.test")
	port := testnet.FreePort(t)
	g, err := New(loadConfig(t, "port: 8443\n"+tlsServerYAML(fmt.Sprintf("http_redirect: {port: %d}", port), c1, k1),
		upstreamRoute("/api", testnet.RefusedAddr(t), "")), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	rln, err := g.ListenRedirect()
	if err != nil || rln == nil {
		t.Fatalf("ListenRedirect: %v %v", rln, err)
	}
	_ = shutdownThenServe(t, g, rln, g.ServeRedirect)
}

// shutdownThenServe shuts g down, then starts serve on ln, and fails the test unless serve
// returns within 5 s; it returns serve's error.
func shutdownThenServe(t *testing.T, g *Gateway, ln net.Listener, serve func(net.Listener) error) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		_ = ln.Close() // let the goroutine end
		<-done
		t.Fatal("serving after Shutdown goes on")
		return nil
	}
}
