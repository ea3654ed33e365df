package conf

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// TLS is server.tls (SPEC 14): present, the listener speaks only TLS.
type TLS struct {
	// Certs are the certificate/key pairs, picked by SNI (the first is the default). Required,
	// at least one. Load reads and checks every pair.
	Certs []TLSCert `json:"certs"`
	// MinVersion is "1.2" (default) or "1.3"; the maximum is always TLS 1.3.
	MinVersion string `json:"min_version"`
	// HandshakeTimeout bounds the handshake, counted from the TCP accept; default read_timeout.
	HandshakeTimeout time.Duration `json:"handshake_timeout"`
	// ClientCAFile, when set, is a PEM bundle: clients must present a certificate it signs
	// (mutual TLS). Empty: no client certificate is asked for.
	ClientCAFile string `json:"client_ca_file,omitempty"`

	// ClientCAs is ClientCAFile parsed by Load; nil when ClientCAFile is empty.
	ClientCAs *x509.CertPool `json:"-"`
	// HTTPRedirect, when set, opens a plaintext listener that redirects to this one
	// (SPEC 20, conf/traffic.go); nil: none.
	HTTPRedirect *HTTPRedirect `json:"http_redirect,omitempty"`
}

// TLSCert is one entry of server.tls.certs.
type TLSCert struct {
	// CertFile is the PEM certificate, optionally followed by its chain. Required.
	CertFile string `json:"cert_file"`
	// KeyFile is the PEM private key of CertFile's first certificate. Required.
	KeyFile string `json:"key_file"`

	// Names are the DNS names of the certificate (its SANs), as -check prints them.
	Names []string `json:"names"`
	// NotAfter is when the certificate expires.
	NotAfter time.Time `json:"not_after"`
	// Pair is the loaded certificate and key, Leaf parsed. Load fills it; it is what the
	// listener serves, so that what was validated is what is served.
	Pair tls.Certificate `json:"-"`
}

// TLS minimum versions of server.tls.min_version.
const (
	TLSVersion12 = "1.2"
	TLSVersion13 = "1.3"
	// DefaultTLSMinVersion: TLS 1.2 is what every client of the last decade speaks; 1.0 and
	// 1.1 are deprecated (RFC 8996).
	DefaultTLSMinVersion = TLSVersion12
)

// Version returns the crypto/tls constant of MinVersion.
func (t *TLS) Version() uint16 {
	if t.MinVersion == TLSVersion13 {
		return tls.VersionTLS13
	}
	return tls.VersionTLS12
}

// MarshalJSON encodes server.tls with its handshake_timeout as a Go duration string.
func (t TLS) MarshalJSON() ([]byte, error) { return marshalWithDurations(reflect.ValueOf(t)) }

// tlsKeys are the keys of server.tls, and of each entry of its certs.
var (
	tlsKeys     = []string{"certs", "client_ca_file", "handshake_timeout", "http_redirect", "min_version"}
	tlsCertKeys = []string{"cert_file", "key_file"}
)

// tlsFieldError is a mistake inside server.tls, named by its path below it
// ("certs[0].key_file"), so that the loader reports "server.tls.certs[0].key_file".
type tlsFieldError struct {
	path, msg string
}

func (e *tlsFieldError) Error() string { return e.path + ": " + e.msg }

// decodeTLS checks and decodes the YAML value of server.tls. Files are not read here: that is
// checkTLS, once the whole configuration is known.
func decodeTLS(v any) (*TLS, error) {
	m, ok := asMap(v)
	if !ok {
		return nil, fmt.Errorf("must be a mapping with at least certs, not %s", yamlLiteral(v))
	}
	t := &TLS{}
	for _, key := range sortedKeys(m) {
		val := m[key]
		switch key {
		case "certs":
			list, ok := val.([]any)
			if !ok {
				return nil, &tlsFieldError{key, "must be a list of {cert_file, key_file}, not " + yamlLiteral(val)}
			}
			for i, item := range list {
				c, err := decodeTLSCert(item)
				if err != nil {
					return nil, &tlsFieldError{fmt.Sprintf("certs[%d]%s", i, err.path), err.msg}
				}
				t.Certs = append(t.Certs, c)
			}
		case "min_version":
			switch x := val.(type) {
			case string:
				t.MinVersion = x
			case float64:
				// min_version: 1.2 without quotes is a YAML number.
				t.MinVersion = strconv.FormatFloat(x, 'f', -1, 64)
			default:
				return nil, &tlsFieldError{key, `must be "1.2" or "1.3", not ` + yamlLiteral(val)}
			}
		case "handshake_timeout":
			d, err := fromYAML(val, kindDuration)
			if err != nil {
				return nil, &tlsFieldError{key, err.Error()}
			}
			t.HandshakeTimeout = d.(time.Duration)
			switch {
			case t.HandshakeTimeout < 0:
				return nil, &tlsFieldError{key, fmt.Sprintf("must not be negative, not %s", t.HandshakeTimeout)}
			case t.HandshakeTimeout == 0:
				return nil, &tlsFieldError{key, "must be greater than 0: a client could hold its connection forever without finishing its handshake (remove the key for read_timeout)"}
			default:
				if msg := checkDurationBound("tls.handshake_timeout", t.HandshakeTimeout); msg != "" {
					return nil, &tlsFieldError{key, msg} // bounds.go
				}
			}
		case "http_redirect":
			h, ferr := decodeHTTPRedirect(val)
			if ferr != nil {
				return nil, ferr
			}
			t.HTTPRedirect = h
		case "client_ca_file":
			s, ok := val.(string)
			if !ok {
				return nil, &tlsFieldError{key, "must be a string (a PEM file), not " + yamlLiteral(val)}
			}
			t.ClientCAFile = s
		default:
			return nil, &tlsFieldError{key, "unknown key (known keys: " + strings.Join(tlsKeys, ", ") + ")"}
		}
	}
	return t, nil
}

func decodeTLSCert(v any) (TLSCert, *tlsFieldError) {
	var c TLSCert
	m, ok := asMap(v)
	if !ok {
		return c, &tlsFieldError{"", "must be a mapping {cert_file, key_file}, not " + yamlLiteral(v)}
	}
	for _, key := range sortedKeys(m) {
		s, ok := m[key].(string)
		switch {
		case key != "cert_file" && key != "key_file":
			return c, &tlsFieldError{"." + key, "unknown key (known keys: " + strings.Join(tlsCertKeys, ", ") + ")"}
		case !ok:
			return c, &tlsFieldError{"." + key, "must be a string (a PEM file), not " + yamlLiteral(m[key])}
		case key == "cert_file":
			c.CertFile = s
		default:
			c.KeyFile = s
		}
	}
	return c, nil
}

// checkTLS validates server.tls: defaults, then every file is read and checked (SPEC 14),
// on every load, so that a reload re-reads the certificates.
func (l *loader) checkTLS(cfg *Config) {
	t := cfg.Server.TLS
	if t == nil {
		return
	}
	bad := func(key, format string, args ...any) { l.configErr("server.tls", key+": "+format, args...) }
	switch t.MinVersion {
	case "":
		t.MinVersion = DefaultTLSMinVersion
	case TLSVersion12, TLSVersion13:
	default:
		bad("min_version", `must be "1.2" or "1.3", not %q (TLS 1.0 and 1.1 are not offered)`, t.MinVersion)
	}
	if t.HandshakeTimeout == 0 {
		// Unset (decodeTLS refuses an explicit zero or a negative value): a client gets as
		// long for its handshake as for its request headers.
		t.HandshakeTimeout = cfg.Server.ReadTimeout
	}
	if len(t.Certs) == 0 {
		bad("certs", "must list at least one {cert_file, key_file}")
	}
	for i := range t.Certs {
		c := &t.Certs[i]
		key := fmt.Sprintf("certs[%d]", i)
		if c.CertFile == "" || c.KeyFile == "" {
			missing := "cert_file"
			if c.CertFile != "" {
				missing = "key_file"
			}
			bad(key+"."+missing, "is required")
			continue
		}
		if err := c.load(); err != nil {
			var fe *tlsFieldError
			if errors.As(err, &fe) {
				bad(key+fe.path, "%s", fe.msg)
			} else {
				bad(key, "%s", err)
			}
		}
	}
	if t.ClientCAFile != "" {
		pool, err := loadCertPool(t.ClientCAFile)
		if err != nil {
			bad("client_ca_file", "%s", err)
		}
		t.ClientCAs = pool
	}
}

// load reads and checks one pair: both files readable, the key the certificate's.
func (c *TLSCert) load() error {
	certPEM, err := os.ReadFile(c.CertFile)
	if err != nil {
		return &tlsFieldError{".cert_file", fmt.Sprintf("cannot read %s: %v", c.CertFile, pathCause(err))}
	}
	keyPEM, err := os.ReadFile(c.KeyFile)
	if err != nil {
		return &tlsFieldError{".key_file", fmt.Sprintf("cannot read %s: %v", c.KeyFile, pathCause(err))}
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("cert_file %s and key_file %s do not load as a pair: %v", c.CertFile, c.KeyFile, err)
	}
	if pair.Leaf == nil {
		leaf, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			return &tlsFieldError{".cert_file", fmt.Sprintf("%s: %v", c.CertFile, err)}
		}
		pair.Leaf = leaf
	}
	c.Pair = pair
	c.Names = pair.Leaf.DNSNames
	if c.Names == nil {
		c.Names = []string{}
	}
	c.NotAfter = pair.Leaf.NotAfter.UTC()
	return nil
}

// loadCertPool reads a PEM bundle of CA certificates; a file with none is an error.
func loadCertPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %v", file, pathCause(err))
	}
	pool := x509.NewCertPool()
	n := 0
	for rest := b; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: certificate %d: %v", file, n+1, err)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return pool, nil
}

// checkRouteTLS validates a route's upstream TLS keys (SPEC 14): they apply to https://
// targets only, and the CA file is read and parsed here, once per load.
func checkRouteTLS(r *Route, in *routeInput, bad func(key, format string, args ...any)) {
	https := strings.HasPrefix(r.Target, "https://")
	for _, key := range []string{"tls_ca_file", "tls_server_name", "tls_insecure_skip_verify"} {
		if in.present[key] && !https && in.present["target"] {
			bad(key, "applies to https:// targets only; the target is %s", r.Target)
		}
	}
	if in.present["tls_server_name"] && !validHostname(strings.ToLower(r.TLSServerName)) {
		bad("tls_server_name", "%q is not a host name", r.TLSServerName)
	}
	if r.TLSCAFile != "" {
		pool, err := loadCertPool(r.TLSCAFile)
		if err != nil {
			bad("tls_ca_file", "%s", err)
		}
		r.TLSRootCAs = pool
	} else if in.present["tls_ca_file"] {
		bad("tls_ca_file", "must name a PEM file (remove the key for the system roots)")
	}
	if r.TLSInsecureSkipVerify && r.TLSCAFile != "" {
		bad("tls_insecure_skip_verify", "true ignores tls_ca_file: set one of the two")
	}
}

// tlsWarnings are the TLS findings that do not stop the gateway: a certificate already
// expired (clients will refuse it, but a renewal may be on its way, and a reload picks it up),
// or a route that does not verify its upstream.
func (c *Config) tlsWarnings() []string {
	var out []string
	if t := c.Server.TLS; t != nil {
		now := time.Now()
		for i, cert := range t.Certs {
			if !cert.NotAfter.IsZero() && now.After(cert.NotAfter) {
				out = append(out, fmt.Sprintf("server.tls.certs[%d]: %s expired on %s: clients will refuse it", i, cert.CertFile, cert.NotAfter.Format(time.RFC3339)))
			}
		}
	}
	for i, r := range c.Routes {
		if r.TLSInsecureSkipVerify {
			out = append(out, fmt.Sprintf("%s: routes[%d] (%s): tls_insecure_skip_verify: the upstream's certificate is not verified; anyone on the path can impersonate %s", c.RoutesFile, i, r.Prefix, r.Target))
		}
	}
	return out
}

// TLSFiles returns every certificate, key and CA file the configuration reads (server.tls and
// the routes' tls_ca_file), each once, in configuration order: what -watch watches besides the
// two configuration files (SPEC 18: a certificate change reloads like SIGHUP).
func (c *Config) TLSFiles() []string {
	var out []string
	seen := make(map[string]bool)
	add := func(f string) {
		if f != "" && !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	if t := c.Server.TLS; t != nil {
		for _, cert := range t.Certs {
			add(cert.CertFile)
			add(cert.KeyFile)
		}
		add(t.ClientCAFile)
	}
	for _, r := range c.Routes {
		add(r.TLSCAFile)
	}
	return out
}
