package demo

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// demoCertValidity is how long the demo certificate is valid: a demo session, with room.
const demoCertValidity = 7 * 24 * time.Hour

// WriteSelfSignedCert writes a fresh self-signed ECDSA P-256 certificate for localhost and
// 127.0.0.1 into dir as cert.pem and key.pem (mode 0600), for `toron -demo-tls`: curl trusts
// it with --cacert cert.pem. The key is generated at each start and never leaves dir.
func WriteSelfSignedCert(dir string) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return "", "", err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "toron demo", Organization: []string{"toron -demo-tls"}},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(demoCertValidity),
		// Its own CA, so that --cacert accepts it as the trust anchor.
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", err
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return "", "", fmt.Errorf("demo: write certificate: %w", err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return "", "", fmt.Errorf("demo: write key: %w", err)
	}
	return certFile, keyFile, nil
}

// TLSBanner is the banner's addition in -demo-tls mode: where the certificate is and how curl
// trusts it.
func TLSBanner(gatewayURL, certFile string) string {
	return fmt.Sprintf(`
TLS (-demo-tls): a self-signed certificate for localhost and 127.0.0.1, made at start:
  %[2]s
  curl -s --cacert %[2]s %[1]s/api/users
  curl -s --cacert %[2]s -o /dev/null -w '%%{http_version} %%{ssl_verify_result}\n' %[1]s/health
  Every command above works over TLS with --cacert %[2]s added.
`, gatewayURL, certFile)
}
