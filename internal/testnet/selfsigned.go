package testnet

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"path/filepath"
	"testing"
	"time"
)

// selfSign makes a new ECDSA P-256 key and a self-signed certificate of tmpl with it, marked a
// CA (it may sign, and stand as a trust anchor); it returns the key and the certificate's DER.
func selfSign(t testing.TB, tmpl *x509.Certificate) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

// SelfSigned writes a self-signed certificate for the DNS names (server auth; a CA too, so that
// it can also stand as a client CA), valid from 48 h before notAfter until notAfter, and its
// PKCS #8 key, as base.crt and base.key in dir.
func SelfSigned(t testing.TB, dir, base string, names []string, notAfter time.Time) (certFile, keyFile string) {
	t.Helper()
	key, der := selfSign(t, &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: base}, DNSNames: names,
		NotBefore: notAfter.Add(-48 * time.Hour), NotAfter: notAfter,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, base+".crt"), filepath.Join(dir, base+".key")
	WritePEM(t, certFile, "CERTIFICATE", der)
	WritePEM(t, keyFile, "PRIVATE KEY", kb)
	return certFile, keyFile
}
