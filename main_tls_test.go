package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"toron/demo"
	"toron/internal/testnet"
)

// trusting returns an HTTPS client that trusts the PEM certificate in certFile.
func trusting(t *testing.T, certFile string) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("%s holds no certificate", certFile)
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
}

// mkdir makes the directory dir and returns it.
func mkdir(t *testing.T, dir string) string {
	t.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// selfSignedIn makes the directory dir and writes a new self-signed pair into it (the demo's).
func selfSignedIn(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile, err := demo.WriteSelfSignedCert(mkdir(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// servedCert returns the CommonName of the certificate that base's /health was served with.
func servedCert(t *testing.T, c *http.Client, base string) (string, error) {
	t.Helper()
	resp, err := c.Get(base + "/health")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	_, _ = io.ReadAll(resp.Body)
	return resp.TLS.PeerCertificates[0].SerialNumber.String(), nil
}

func TestDemoTLSServes(t *testing.T) {
	port, rport := testnet.FreePort(t), testnet.FreePort(t)
	cmd, stdout := startDemo(t, "-demo-tls", fmt.Sprintf("TORON_SERVER__PORT=%d", port), fmt.Sprintf("TORON_DEMO_REDIRECT_PORT=%d", rport))
	certLine := regexp.MustCompile(`curl -s --cacert (\S+) https://127\.0\.0\.1:\d+/api/users`)
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := certLine.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
		close(found)
	}()
	var certFile string
	select {
	case certFile = <-found:
	case <-time.After(20 * time.Second):
		t.Fatal("no curl --cacert line in the banner")
	}
	c := trusting(t, certFile)
	base := fmt.Sprintf("https://127.0.0.1:%d", port)
	if code, b := get(t, c, base+"/api/users"); code != 200 || !strings.Contains(b, `"service":"api"`) {
		t.Errorf("demo over TLS: %d %s", code, b)
	}
	// SPEC 20: the HTTPS redirect listener sends plain http to the TLS port.
	noFollow := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Get(fmt.Sprintf("http://127.0.0.1:%d/api/users?x=1", rport))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if want := base + "/api/users?x=1"; resp.StatusCode != 308 || resp.Header.Get("Location") != want {
		t.Errorf("redirect listener: %d Location %q, want 308 %s", resp.StatusCode, resp.Header.Get("Location"), want)
	}
	stopBinary(t, cmd, nil)
	if _, err := os.Stat(filepath.Dir(certFile)); !os.IsNotExist(err) {
		t.Errorf("the demo certificate's directory outlives the process: %v", err)
	}
}

func TestCheckTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, err := demo.WriteSelfSignedCert(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey := selfSignedIn(t, filepath.Join(dir, "other"))
	routes := writeFile(t, dir, "routes.yaml", "routes:\n  - {type: upstream, prefix: /, target: \"https://127.0.0.1:9\", tls_insecure_skip_verify: true}\n")
	check := func(key string) (int, string, string) {
		cfg := writeFile(t, dir, "config.yaml", fmt.Sprintf("server:\n  tls:\n    certs:\n      - {cert_file: %q, key_file: %q}\n", certFile, key))
		return runBinary(nil, "-check", "-config", cfg, "-routes", routes)
	}
	code, out, errOut := check(keyFile)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{`"cert_file": "` + certFile, `"names": [`, `"localhost"`, `"not_after": "`, `"handshake_timeout": "5s"`} {
		if !strings.Contains(out, want) {
			t.Errorf("-check lacks %s:\n%s", want, out)
		}
	}
	if !strings.Contains(errOut, "warning: routes.yaml") && !strings.Contains(errOut, "tls_insecure_skip_verify") {
		t.Errorf("no insecure-skip warning on stderr: %q", errOut)
	}
	code, _, errOut = check(otherKey)
	if code != 2 || !strings.Contains(errOut, "server.tls: certs[0]: cert_file "+certFile+" and key_file "+otherKey+" do not load as a pair") {
		t.Errorf("mismatched pair: exit %d, stderr %q", code, errOut)
	}
}

// SIGHUP re-reads the certificate files: a new pair serves new connections; a mismatched pair
// is refused, logged and counted, and the pair in force keeps serving.
// tlsBinary is a started gateway binary serving TLS with a self-signed pair in certDir.
type tlsBinary struct {
	cmd               *exec.Cmd
	stderr            *testnet.Buffer
	base              string
	certFile, keyFile string
	serial            string // the serial of the certificate served first
}

// startTLSBinary writes a pair into certDir and a config using it into dir, starts the binary
// with args before its -config and -routes, and waits until it serves TLS.
func startTLSBinary(t *testing.T, dir, certDir string, args ...string) *tlsBinary {
	t.Helper()
	certFile, keyFile, err := demo.WriteSelfSignedCert(certDir)
	if err != nil {
		t.Fatal(err)
	}
	port := testnet.FreePort(t)
	cfg := writeFile(t, dir, "config.yaml", fmt.Sprintf("server:\n  host: 127.0.0.1\n  port: %d\n  drain_delay: 0s\n  tls:\n    certs:\n      - {cert_file: %q, key_file: %q}\nlog:\n  access: false\n", port, certFile, keyFile))
	routes := writeFile(t, dir, "routes.yaml", "routes: []\n")
	cmd := exec.Command(binPath, append(args, "-config", cfg, "-routes", routes)...)
	b := &tlsBinary{cmd: cmd, stderr: &testnet.Buffer{}, base: fmt.Sprintf("https://127.0.0.1:%d", port), certFile: certFile, keyFile: keyFile}
	cmd.Stderr = b.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
	first := trusting(t, certFile) // the first certificate, as the client knows it
	deadline := time.Now().Add(10 * time.Second)
	for b.serial == "" {
		if b.serial, err = servedCert(t, first, b.base); err != nil && time.Now().After(deadline) {
			t.Fatalf("never served over TLS: %v\n%s", err, b.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return b
}

// replacePair moves a new self-signed pair (made in dir) over the served files, key first,
// and returns a client that trusts only the new certificate.
func (b *tlsBinary) replacePair(t *testing.T, dir string) *http.Client {
	t.Helper()
	c2, k2 := selfSignedIn(t, dir)
	second, _ := os.ReadFile(c2)
	if err := os.Rename(k2, b.keyFile); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(c2, b.certFile); err != nil {
		t.Fatal(err)
	}
	return trusting(t, writeFile(t, dir, "trust.pem", string(second)))
}

// waitNewCert waits until c is served a certificate other than the first one, and returns it.
func (b *tlsBinary) waitNewCert(t *testing.T, c *http.Client, what string) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if s, err := servedCert(t, c, b.base); err == nil && s != b.serial {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new pair is not served %s:\n%s", what, b.stderr.String())
		}
	}
}

func TestTLSReloadOnSIGHUP(t *testing.T) {
	dir := t.TempDir()
	b := startTLSBinary(t, dir, dir)
	cmd, stderr, base, certFile, keyFile := b.cmd, b.stderr, b.base, b.certFile, b.keyFile

	// A new pair in place, then SIGHUP: new connections get it.
	withSecond := b.replacePair(t, filepath.Join(dir, "next"))
	_ = cmd.Process.Signal(syscall.SIGHUP)
	serial2 := b.waitNewCert(t, withSecond, "after SIGHUP")

	// A mismatched pair: the key of yet another certificate.
	_, k3 := selfSignedIn(t, filepath.Join(dir, "third"))
	if err := os.Rename(k3, keyFile); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Signal(syscall.SIGHUP)
	waitLogged(t, stderr, "reload refused", "the mismatched pair was not refused")
	if !strings.Contains(stderr.String(), "do not load as a pair") {
		t.Errorf("the refusal does not say why:\n%s", stderr.String())
	}
	if s, err := servedCert(t, withSecond, base); err != nil || s != serial2 {
		t.Errorf("after the refused reload: serial %s, %v; want the second pair %s", s, err, serial2)
	}
	_, metricsText := get(t, withSecond, base+"/metrics")
	for _, want := range []string{"toron_config_reloads_total 1", "toron_config_reload_errors_total 1", `toron_tls_cert_expiry_timestamp_seconds{cert="` + certFile + `"}`} {
		if !strings.Contains(metricsText, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	stopBinary(t, cmd, stderr)
}

// TestWatchCertificateChangeReloads: with -watch, a certificate pair replaced in place (its
// directory is watched, like the config's) is served to new connections without a SIGHUP.
func TestWatchCertificateChangeReloads(t *testing.T) {
	dir := t.TempDir()
	tlsDir := mkdir(t, filepath.Join(dir, "tls")) // a directory of its own: watched because a cert is in it
	b := startTLSBinary(t, dir, tlsDir, "-watch")
	withSecond := b.replacePair(t, filepath.Join(dir, "next"))
	b.waitNewCert(t, withSecond, "after the files changed under -watch")
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
}

// TestWatchPicksUpFilesOfARefusedConfig (SPEC 18): -watch also watches the files that a
// refused configuration names. A ConfigMap that renames the certificate before its Secret
// arrives is refused (the files do not exist yet); when they arrive, in a directory nothing
// watched before, the reload follows without another edit.
func TestWatchPicksUpFilesOfARefusedConfig(t *testing.T) {
	dir := t.TempDir()
	b := startTLSBinary(t, dir, mkdir(t, filepath.Join(dir, "tls")), "-watch")
	next, late := filepath.Join(dir, "next"), mkdir(t, filepath.Join(dir, "late"))
	c2, k2 := selfSignedIn(t, next)
	second, _ := os.ReadFile(c2)
	withSecond := trusting(t, writeFile(t, next, "trust.pem", string(second)))
	lateCert, lateKey := filepath.Join(late, filepath.Base(c2)), filepath.Join(late, filepath.Base(k2))

	cfg := filepath.Join(dir, "config.yaml")
	old, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	renamed := strings.NewReplacer(b.certFile, lateCert, b.keyFile, lateKey).Replace(string(old))
	if err := os.Rename(writeFile(t, dir, ".config.yaml.new", renamed), cfg); err != nil {
		t.Fatal(err)
	}
	waitLogged(t, b.stderr, "configuration reload refused", "the configuration naming missing files was not refused")
	// The Secret arrives: the pair appears where the refused configuration said.
	if err := os.Rename(k2, lateKey); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(c2, lateCert); err != nil {
		t.Fatal(err)
	}
	b.waitNewCert(t, withSecond, "after the files a refused configuration named arrived")
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
}
