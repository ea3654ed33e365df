package conf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"toron/internal/testnet"
)

func tlsConfig(certs ...string) string {
	var b strings.Builder
	b.WriteString("server:\n  tls:\n    certs:\n")
	for i := 0; i+1 < len(certs); i += 2 {
		b.WriteString("      - {cert_file: \"" + certs[i] + "\", key_file: \"" + certs[i+1] + "\"}\n")
	}
	return b.String()
}

func TestTLSLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	exp := time.Now().Add(30 * 24 * time.Hour).Truncate(time.Second)
	c1, k1 := testnet.SelfSigned(t, dir, "a", []string{"a.example.com", "*.example.com"}, exp)
	c2, k2 := testnet.SelfSigned(t, dir, "b", []string{"b.test"}, exp)
	cfg := mustLoad(t, tlsConfig(c1, k1, c2, k2)+"    client_ca_file: \""+c2+"\"\n  read_timeout: 7s\n", okRoute)
	tl := cfg.Server.TLS
	if tl == nil || len(tl.Certs) != 2 {
		t.Fatalf("tls = %+v", tl)
	}
	if tl.MinVersion != "1.2" || tl.HandshakeTimeout != 7*time.Second {
		t.Errorf("defaults: min_version %q, handshake_timeout %s; want 1.2 and read_timeout 7s", tl.MinVersion, tl.HandshakeTimeout)
	}
	if got := strings.Join(tl.Certs[0].Names, ","); got != "a.example.com,*.example.com" {
		t.Errorf("names %q", got)
	}
	if !tl.Certs[0].NotAfter.Equal(exp) || tl.Certs[0].Pair.Leaf == nil || tl.ClientCAs == nil {
		t.Errorf("cert 0: not_after %v (want %v), leaf %v, client CAs %v", tl.Certs[0].NotAfter, exp, tl.Certs[0].Pair.Leaf != nil, tl.ClientCAs != nil)
	}
	out, err := cfg.CheckJSON()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"handshake_timeout": "7s"`, `"names": [`, `"*.example.com"`, `"not_after": "` + exp.UTC().Format(time.RFC3339), `"min_version": "1.2"`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("-check lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "PRIVATE") || strings.Contains(string(out), "pair") {
		t.Errorf("-check shows the key:\n%s", out)
	}
	if len(cfg.Warnings) != 0 {
		t.Errorf("warnings: %q", cfg.Warnings)
	}

	// Unquoted 1.3 is the YAML number 1.3: accepted.
	cfg = mustLoad(t, tlsConfig(c1, k1)+"    min_version: 1.3\n    handshake_timeout: 2s\n", okRoute)
	if cfg.Server.TLS.MinVersion != "1.3" || cfg.Server.TLS.Version() != 0x0304 || cfg.Server.TLS.HandshakeTimeout != 2*time.Second {
		t.Errorf("tls = %+v", cfg.Server.TLS)
	}
	if cfg := mustLoad(t, "", okRoute); cfg.Server.TLS != nil {
		t.Error("TLS on without server.tls")
	}
}

func TestTLSErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	exp := time.Now().Add(time.Hour)
	c1, k1 := testnet.SelfSigned(t, dir, "a", []string{"a.test"}, exp)
	_, k2 := testnet.SelfSigned(t, dir, "b", []string{"b.test"}, exp)
	missing := filepath.Join(dir, "missing.pem")
	unreadable := filepath.Join(dir, "dir.pem")
	if err := os.Mkdir(unreadable, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct{ config, want string }{
		"missing cert":   {tlsConfig(missing, k1), "config.yaml: server.tls: certs[0].cert_file: cannot read " + missing + ": no such file or directory"},
		"missing key":    {tlsConfig(c1, k1, c1, missing), "config.yaml: server.tls: certs[1].key_file: cannot read " + missing},
		"unreadable":     {tlsConfig(unreadable, k1), "server.tls: certs[0].cert_file: cannot read " + unreadable},
		"mismatch":       {tlsConfig(c1, k2), "config.yaml: server.tls: certs[0]: cert_file " + c1 + " and key_file " + k2 + " do not load as a pair: tls: private key does not match public key"},
		"key missing":    {"server:\n  tls:\n    certs: [{cert_file: x}]\n", "server.tls: certs[0].key_file: is required"},
		"no certs":       {"server:\n  tls: {min_version: \"1.2\"}\n", "server.tls: certs: must list at least one"},
		"old version":    {tlsConfig(c1, k1) + "    min_version: \"1.1\"\n", `server.tls: min_version: must be "1.2" or "1.3", not "1.1"`},
		"unknown key":    {tlsConfig(c1, k1) + "    ciphers: [x]\n", "config.yaml: server.tls: ciphers: unknown key (known keys: certs, client_ca_file, handshake_timeout, http_redirect, min_version)"},
		"unknown cert":   {"server:\n  tls:\n    certs: [{cert: x}]\n", "server.tls: certs[0].cert: unknown key"},
		"negative":       {tlsConfig(c1, k1) + "    handshake_timeout: -1s\n", "server.tls: handshake_timeout: must not be negative"},
		"zero":           {tlsConfig(c1, k1) + "    handshake_timeout: 0s\n", "server.tls: handshake_timeout: must be greater than 0"},
		"no unit":        {tlsConfig(c1, k1) + "    handshake_timeout: 5\n", "server.tls: handshake_timeout: 5 has no unit"},
		"below floor":    {tlsConfig(c1, k1) + "    handshake_timeout: 1ns\n", "config.yaml: server.tls: handshake_timeout: must be at least 100ms, not 1ns: a client across any real network could not finish its handshake"},
		"above ceiling":  {tlsConfig(c1, k1) + "    handshake_timeout: 1h\n", "config.yaml: server.tls: handshake_timeout: must be at most 1m, not 1h"},
		"not a mapping":  {"server:\n  tls: true\n", "server.tls: must be a mapping with at least certs"},
		"client ca":      {tlsConfig(c1, k1) + "    client_ca_file: \"" + missing + "\"\n", "server.tls: client_ca_file: cannot read " + missing},
		"client ca junk": {tlsConfig(c1, k1) + "    client_ca_file: \"" + k1 + "\"\n", "server.tls: client_ca_file: " + k1 + " holds no PEM certificate"},
	} {
		_, err := loadStrings(tc.config, okRoute)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v\nwant it to contain %q", name, err, tc.want)
		}
	}
	// The environment cannot set the mapping.
	if _, err := loadStrings("", okRoute, "TORON_SERVER__TLS=x"); err == nil || !strings.Contains(err.Error(), "TORON_SERVER__TLS: cannot be set from the environment") {
		t.Errorf("env: err = %v", err)
	}
}

func TestTLSExpiredIsAWarning(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c1, k1 := testnet.SelfSigned(t, dir, "old", []string{"a.test"}, time.Now().Add(-time.Hour))
	cfg := mustLoad(t, tlsConfig(c1, k1), okRoute)
	if len(cfg.Warnings) != 1 || !strings.Contains(cfg.Warnings[0], "server.tls.certs[0]: "+c1+" expired on ") {
		t.Errorf("warnings: %q", cfg.Warnings)
	}
}

func TestTLSReloadCompatible(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c1, k1 := testnet.SelfSigned(t, dir, "a", []string{"a.test"}, time.Now().Add(time.Hour))
	plain := mustLoad(t, "", okRoute)
	withTLS := mustLoad(t, tlsConfig(c1, k1), okRoute)
	if err := withTLS.ReloadCompatible(plain); err == nil || err.Error() != "config.yaml: server.tls: cannot change on reload (absent -> present): restart the gateway to apply it" {
		t.Errorf("TLS turned on by a reload: err = %v", err)
	}
	if err := plain.ReloadCompatible(withTLS); err == nil || !strings.Contains(err.Error(), "server.tls: cannot change on reload (present -> absent)") {
		t.Errorf("TLS turned off by a reload: err = %v", err)
	}
	c2, k2 := testnet.SelfSigned(t, dir, "b", []string{"b.test"}, time.Now().Add(time.Hour))
	if err := mustLoad(t, tlsConfig(c2, k2)+"    min_version: \"1.3\"\n", okRoute).ReloadCompatible(withTLS); err != nil {
		t.Errorf("new certificates and version refused: %v", err)
	}
}

func TestRouteTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, _ := testnet.SelfSigned(t, dir, "ca", []string{"up.test"}, time.Now().Add(time.Hour))
	cfg := mustLoad(t, "", route(
		`type: upstream, prefix: /a, target: "https://127.0.0.1:9443", tls_ca_file: "`+ca+`", tls_server_name: up.test`,
		`type: upstream, prefix: /b, target: "https://127.0.0.1:9444", tls_insecure_skip_verify: true`,
	))
	a := findRoute(t, cfg, "/a")
	if a.TLSRootCAs == nil || a.TLSServerName != "up.test" {
		t.Errorf("route /a: %+v", a)
	}
	if len(cfg.Warnings) != 1 || !strings.Contains(cfg.Warnings[0], "routes.yaml: routes[1] (/b): tls_insecure_skip_verify: the upstream's certificate is not verified") {
		t.Errorf("warnings: %q", cfg.Warnings)
	}
	out, _ := cfg.CheckJSON()
	if !strings.Contains(string(out), `"tls_server_name": "up.test"`) || !strings.Contains(string(out), `"tls_insecure_skip_verify": true`) {
		t.Errorf("-check:\n%s", out)
	}
	for name, tc := range map[string]struct{ entry, want string }{
		"plain target":  {`type: upstream, prefix: /a, target: "http://127.0.0.1:1", tls_server_name: x.test`, "routes.yaml: routes[0] (/a): tls_server_name: applies to https:// targets only"},
		"missing ca":    {`type: upstream, prefix: /a, target: "https://127.0.0.1:1", tls_ca_file: /nonexistent/ca.pem`, "routes[0] (/a): tls_ca_file: cannot read /nonexistent/ca.pem: no such file or directory"},
		"empty ca":      {`type: upstream, prefix: /a, target: "https://127.0.0.1:1", tls_ca_file: ""`, "tls_ca_file: must name a PEM file"},
		"bad name":      {`type: upstream, prefix: /a, target: "https://127.0.0.1:1", tls_server_name: "a b"`, `tls_server_name: "a b" is not a host name`},
		"both":          {`type: upstream, prefix: /a, target: "https://127.0.0.1:1", tls_ca_file: "` + ca + `", tls_insecure_skip_verify: true`, "tls_insecure_skip_verify: true ignores tls_ca_file"},
		"not a boolean": {`type: upstream, prefix: /a, target: "https://127.0.0.1:1", tls_insecure_skip_verify: "yes"`, "tls_insecure_skip_verify: must be true or false"},
	} {
		_, err := loadStrings("", route(tc.entry))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v\nwant it to contain %q", name, err, tc.want)
		}
	}
}

func TestTLSFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c1, k1 := testnet.SelfSigned(t, dir, "a", []string{"a.test"}, time.Now().Add(time.Hour))
	cfg := mustLoad(t, tlsConfig(c1, k1, c1, k1)+"    client_ca_file: \""+c1+"\"\n", route(
		`type: upstream, prefix: /a, target: "https://127.0.0.1:1", tls_ca_file: "`+c1+`"`,
		`type: upstream, prefix: /b, target: "http://127.0.0.1:1"`,
	))
	if got := strings.Join(cfg.TLSFiles(), ","); got != c1+","+k1 {
		t.Errorf("TLSFiles = %q, want each file once", got)
	}
	if got := mustLoad(t, "", okRoute).TLSFiles(); len(got) != 0 {
		t.Errorf("plain configuration: TLSFiles = %q", got)
	}
}
