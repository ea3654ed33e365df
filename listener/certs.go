package listener

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"
)

// metricCertExpiry is SPEC 14's expiry gauge: the NotAfter of each certificate in service, as
// a Unix time, labelled with the cert_file it came from.
const metricCertExpiry = "toron_tls_cert_expiry_timestamp_seconds"

// Cert is one certificate of the listener: the parsed pair and the name it is known by in
// metrics (the cert_file value of the configuration).
type Cert struct {
	// Name labels the certificate's expiry gauge; it is the cert_file of the configuration.
	Name string
	// Certificate is the loaded pair; its Leaf is parsed by NewCertStore/Swap when nil.
	Certificate tls.Certificate
}

// ErrNoCerts is a certificate store asked to serve no certificate at all.
var ErrNoCerts = errors.New("listener: a TLS listener needs at least one certificate")

// certSet is one immutable generation of the store: the certificates in configuration order
// and the two indexes SNI is answered from.
type certSet struct {
	certs []*tls.Certificate
	names []string
	// exact maps a lower-case DNS name to the first certificate listing it.
	exact map[string]*tls.Certificate
	// wildcard maps the parent of a "*.example.com" name ("example.com") to the first
	// certificate listing that wildcard.
	wildcard map[string]*tls.Certificate
}

// CertStore picks the certificate of a TLS handshake by SNI (SPEC 14): an exact DNS name of
// any certificate first, then a one-label wildcard ("*.example.com" matches "a.example.com",
// never "a.b.example.com" nor "example.com"), else the first certificate, which is also what a
// client without SNI gets. The set in force sits behind an atomic pointer: Swap replaces it
// for the handshakes that start afterwards, and connections already open keep theirs.
type CertStore struct {
	cur atomic.Pointer[certSet]

	set *metrics.Set
	mu  sync.Mutex      // serialises Swap: the expiry gauges follow the set in force
	reg map[string]bool // expiry gauges registered, by cert name
}

// NewCertStore returns a store serving certs; set (may be nil) receives the expiry gauges.
func NewCertStore(certs []Cert, set *metrics.Set) (*CertStore, error) {
	s := &CertStore{set: set, reg: make(map[string]bool)}
	if err := s.Swap(certs); err != nil {
		return nil, err
	}
	return s, nil
}

// CheckCerts reports what Swap would refuse in certs, without putting anything in force (a
// reload checks every step before it swaps any, SPEC 18).
func CheckCerts(certs []Cert) error {
	_, err := newCertSet(certs)
	return err
}

// Swap puts certs in force for new handshakes. On error the set in force is unchanged.
func (s *CertStore) Swap(certs []Cert) error {
	cs, err := newCertSet(certs)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur.Store(cs)
	if s.set == nil {
		return nil
	}
	now := make(map[string]bool, len(cs.names))
	for i, name := range cs.names {
		expiry := float64(cs.certs[i].Leaf.NotAfter.Unix())
		s.set.GetOrCreateGauge(certExpiryMetric(name), nil).Set(expiry)
		now[name] = true
	}
	for name := range s.reg {
		if !now[name] {
			s.set.UnregisterMetric(certExpiryMetric(name))
		}
	}
	s.reg = now
	return nil
}

func newCertSet(certs []Cert) (*certSet, error) {
	if len(certs) == 0 {
		return nil, ErrNoCerts
	}
	cs := &certSet{
		exact:    make(map[string]*tls.Certificate),
		wildcard: make(map[string]*tls.Certificate),
	}
	for i := range certs {
		c := certs[i].Certificate // a copy: the caller's value is not modified
		if c.Leaf == nil {
			if len(c.Certificate) == 0 {
				return nil, errors.New("listener: certificate " + certs[i].Name + " holds no certificate")
			}
			leaf, err := x509.ParseCertificate(c.Certificate[0])
			if err != nil {
				return nil, errors.New("listener: certificate " + certs[i].Name + ": " + err.Error())
			}
			c.Leaf = leaf
		}
		cp := &c
		cs.certs = append(cs.certs, cp)
		cs.names = append(cs.names, certs[i].Name)
		for _, n := range c.Leaf.DNSNames {
			n = strings.TrimSuffix(strings.ToLower(n), ".")
			if parent, ok := strings.CutPrefix(n, "*."); ok {
				if parent != "" && cs.wildcard[parent] == nil {
					cs.wildcard[parent] = cp
				}
				continue
			}
			if cs.exact[n] == nil {
				cs.exact[n] = cp
			}
		}
	}
	return cs, nil
}

// GetCertificate is the tls.Config callback: the certificate for hello's server name.
func (s *CertStore) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.cur.Load().pick(hello.ServerName), nil
}

// pick applies the SNI rule to a server name (empty: no SNI).
func (cs *certSet) pick(name string) *tls.Certificate {
	if name == "" {
		return cs.certs[0]
	}
	name = lowerName(name)
	if c := cs.exact[name]; c != nil {
		return c
	}
	// One label only: the wildcard of "a.example.com" is keyed "example.com".
	if i := strings.IndexByte(name, '.'); i > 0 {
		if c := cs.wildcard[name[i+1:]]; c != nil {
			return c
		}
	}
	return cs.certs[0]
}

// lowerName lower-cases a server name and drops a trailing dot, without allocating for the
// usual name that is already lower case.
func lowerName(name string) string {
	name = strings.TrimSuffix(name, ".")
	for i := 0; i < len(name); i++ {
		if c := name[i]; 'A' <= c && c <= 'Z' {
			return strings.ToLower(name)
		}
	}
	return name
}

// Names returns the cert names in force, in configuration order.
func (s *CertStore) Names() []string {
	return append([]string(nil), s.cur.Load().names...)
}

// certExpiryMetric is the expiry gauge's name for one cert, its label value escaped as the
// Prometheus text format wants (backslash, double quote, newline).
func certExpiryMetric(name string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return metricCertExpiry + `{cert="` + r.Replace(name) + `"}`
}
