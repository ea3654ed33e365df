package listener

import (
	"crypto/tls"
	"math/big"
	"strings"
	"testing"
	"time"

	"toron/internal/testnet"

	"github.com/VictoriaMetrics/metrics"
)

func TestCertStorePick(t *testing.T) {
	ca := testnet.NewCA(t)
	day := time.Now().Add(24 * time.Hour)
	certs := []Cert{
		{Name: "default.pem", Certificate: ca.Issue(t, "default", []string{"default.test"}, day)},
		{Name: "wild.pem", Certificate: ca.Issue(t, "wild", []string{"*.example.com"}, day)},
		{Name: "exact.pem", Certificate: ca.Issue(t, "exact", []string{"api.example.com", "Other.Test"}, day)},
		{Name: "wild2.pem", Certificate: ca.Issue(t, "wild2", []string{"*.example.com", "two.test"}, day)},
	}
	s, err := NewCertStore(certs, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ sni, want string }{
		{"", "default"},                // no SNI: the first cert
		{"unknown.test", "default"},    // no match: the first cert
		{"api.example.com", "exact"},   // exact beats the earlier wildcard
		{"API.Example.COM.", "exact"},  // case and a trailing dot do not matter
		{"other.test", "exact"},        // names are compared in lower case
		{"www.example.com", "wild"},    // wildcard, the first cert listing it
		{"a.b.example.com", "default"}, // a wildcard covers one label only
		{"example.com", "default"},     // nor the bare parent
		{"two.test", "wild2"},          // a later cert's exact name
		{"default.test", "default"},    // the first cert by name
		{".example.com", "default"},    // an empty label is no match
		{"x.default.test", "default"},  // no wildcard for default.test
		{"www.example.com.evil", "default"},
	} {
		c, err := s.GetCertificate(&tls.ClientHelloInfo{ServerName: tc.sni})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Leaf.Subject.CommonName; got != tc.want {
			t.Errorf("SNI %q: got cert %q, want %q", tc.sni, got, tc.want)
		}
	}
}

func TestCertStoreSwapAndExpiryGauge(t *testing.T) {
	ca := testnet.NewCA(t)
	set := metrics.NewSet()
	exp1 := time.Now().Add(48 * time.Hour).Truncate(time.Second)
	exp2 := time.Now().Add(72 * time.Hour).Truncate(time.Second)
	s, err := NewCertStore([]Cert{
		{Name: "a.pem", Certificate: ca.Issue(t, "a", []string{"a.test"}, exp1)},
		{Name: `we"ird.pem`, Certificate: ca.Issue(t, "w", []string{"w.test"}, exp1)},
	}, set)
	if err != nil {
		t.Fatal(err)
	}
	text := metricsText(set)
	for _, want := range []string{
		`toron_tls_cert_expiry_timestamp_seconds{cert="a.pem"} ` + itoa(exp1.Unix()),
		`toron_tls_cert_expiry_timestamp_seconds{cert="we\"ird.pem"} ` + itoa(exp1.Unix()),
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q:\n%s", want, text)
		}
	}
	if err := s.Swap([]Cert{{Name: "a.pem", Certificate: ca.Issue(t, "a2", []string{"a.test"}, exp2)}}); err != nil {
		t.Fatal(err)
	}
	text = metricsText(set)
	if want := `toron_tls_cert_expiry_timestamp_seconds{cert="a.pem"} ` + itoa(exp2.Unix()); !strings.Contains(text, want) {
		t.Errorf("after the swap, metrics lack %q:\n%s", want, text)
	}
	if strings.Contains(text, "ird.pem") {
		t.Errorf("a cert no longer served keeps its gauge:\n%s", text)
	}
	c, _ := s.GetCertificate(&tls.ClientHelloInfo{ServerName: "w.test"})
	if c.Leaf.Subject.CommonName != "a2" {
		t.Errorf("after the swap, got %q, want a2", c.Leaf.Subject.CommonName)
	}
	if err := s.Swap(nil); err == nil {
		t.Error("swap to no certificate accepted")
	}
	if c, _ := s.GetCertificate(&tls.ClientHelloInfo{}); c.Leaf.Subject.CommonName != "a2" {
		t.Error("a refused swap changed the certificates in force")
	}
}

func metricsText(set *metrics.Set) string {
	var b strings.Builder
	set.WritePrometheus(&b)
	return b.String()
}

func itoa(n int64) string { return big.NewInt(n).String() }
