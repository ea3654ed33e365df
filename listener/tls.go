package listener

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// metricHandshakeErrors counts TLS handshakes that failed or did not finish in time (SPEC 14).
const metricHandshakeErrors = "toron_tls_handshake_errors_total"

// alpnHTTP11 is the only protocol the listener offers: Toron speaks HTTP/1.1 (SPEC 11 keeps
// HTTP/2 out of scope), so a client must not be told h2 is possible.
var alpnHTTP11 = []string{"http/1.1"}

// TLSOptions configure a TLS listener. They may change on reload (TLS.Update), except that the
// listener stays a TLS listener.
type TLSOptions struct {
	// Certs serves the certificates, picked by SNI. Required.
	Certs *CertStore
	// MinVersion is tls.VersionTLS12 (the default when 0) or tls.VersionTLS13; the maximum
	// is always TLS 1.3.
	MinVersion uint16
	// ClientCAs, when not nil, turns mutual TLS on: a client must present a certificate
	// these roots sign.
	ClientCAs *x509.CertPool
	// HandshakeTimeout bounds the handshake, counted from the TCP accept; > 0.
	HandshakeTimeout time.Duration
}

// TLS wraps a listener so that every accepted connection speaks TLS. Accept never waits for
// a handshake: the handshake runs on the connection's own goroutine at its first Read or Write
// (or Handshake), under a deadline set at the accept, so a silent or dripping client is closed
// at HandshakeTimeout and cannot hold the accept loop, nor a worker of the gateway, which is
// only taken once a request's headers arrived.
type TLS struct {
	net.Listener

	// base is handed to tls.Server; it only selects the generation in force (conf), so that
	// a reload changes certificates, versions and client CAs for new handshakes.
	base   *tls.Config
	conf   atomic.Pointer[tlsGeneration]
	errors *metrics.Counter
}

// tlsGeneration is one TLSOptions turned into a server config.
type tlsGeneration struct {
	cfg     *tls.Config
	timeout time.Duration
}

// NewTLS wraps ln. set (may be nil) receives toron_tls_handshake_errors_total.
func NewTLS(ln net.Listener, o TLSOptions, set *metrics.Set) (*TLS, error) {
	l := &TLS{Listener: ln}
	if set != nil {
		l.errors = set.GetOrCreateCounter(metricHandshakeErrors)
	} else {
		l.errors = new(metrics.Counter)
	}
	if err := l.Update(o); err != nil {
		return nil, err
	}
	l.base = &tls.Config{
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return l.conf.Load().cfg, nil
		},
	}
	return l, nil
}

// Check reports what Update would refuse in o, without putting anything in force: a reload
// checks every step before it swaps any (SPEC 18). A nil Certs is allowed here (the store is
// the listener's own, checked with CheckCerts).
func (o TLSOptions) Check() error {
	if o.HandshakeTimeout <= 0 {
		return errors.New("listener: handshake timeout must be positive")
	}
	if v := o.MinVersion; v != 0 && v != tls.VersionTLS12 && v != tls.VersionTLS13 {
		return errors.New("listener: minimum TLS version must be 1.2 or 1.3")
	}
	return nil
}

// Update puts o in force for the connections accepted from now on.
func (l *TLS) Update(o TLSOptions) error {
	if o.Certs == nil {
		return ErrNoCerts
	}
	if err := o.Check(); err != nil {
		return err
	}
	minVersion := o.MinVersion
	if minVersion == 0 {
		minVersion = tls.VersionTLS12
	}
	cfg := &tls.Config{
		MinVersion:     minVersion,
		MaxVersion:     tls.VersionTLS13,
		NextProtos:     alpnHTTP11,
		GetCertificate: o.Certs.GetCertificate,
	}
	if o.ClientCAs != nil {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = o.ClientCAs
	}
	l.conf.Store(&tlsGeneration{cfg: cfg, timeout: o.HandshakeTimeout})
	return nil
}

// HandshakeErrors returns the number of failed handshakes so far.
func (l *TLS) HandshakeErrors() uint64 { return l.errors.Get() }

// Accept returns the next connection as a TLS server connection whose handshake is still to
// come. The raw socket's deadline is set to the accept plus the handshake timeout at once, so
// that the bound holds even if nobody reads the connection.
func (l *TLS) Accept() (net.Conn, error) {
	raw, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	g := l.conf.Load()
	now := time.Now()
	// A socket that cannot take a deadline is already broken: its first read says so.
	_ = raw.SetDeadline(now.Add(g.timeout))
	return &tlsConn{Conn: tls.Server(raw, l.base), raw: raw, ln: l, acceptedAt: now}, nil
}

// tlsConn is an accepted TLS connection whose handshake runs, bounded, at its first use.
//
// The layer above (the gateway's connection) arms its own deadlines as soon as it gets the
// connection, relative to the accept. While the handshake has not finished, those are
// recorded instead of applied (the handshake deadline governs), and once it finished they are
// applied shifted by the time the handshake took: the handshake does not eat into the header
// deadline, as nginx starts client_header_timeout after ssl_handshake_timeout.
type tlsConn struct {
	*tls.Conn
	raw        net.Conn
	ln         *TLS
	acceptedAt time.Time

	once sync.Once
	err  error
	done atomic.Bool // the handshake finished (well or not): deadlines go straight through

	mu     sync.Mutex
	rd, wd time.Time // deadlines set from above before the handshake finished
}

// Handshake runs the server handshake once, under the deadline set at the accept.
func (c *tlsConn) Handshake() error {
	if c.done.Load() {
		return c.err
	}
	c.once.Do(c.handshake)
	return c.err
}

func (c *tlsConn) handshake() {
	// tls.Conn.Handshake with no context: HandshakeContext with a deadline would start a
	// goroutine per connection to watch it; the socket deadline set at the accept bounds it.
	err := c.Conn.Handshake()
	if err != nil {
		c.failed(err)
	}
	// The recorded deadlines are applied before done is set, under mu: a deadline set from
	// above meanwhile waits, then goes straight through, so the later one wins.
	c.mu.Lock()
	defer c.mu.Unlock()
	c.err = err
	if err == nil {
		shift := time.Since(c.acceptedAt)
		rd, wd := c.rd, c.wd
		if !rd.IsZero() {
			rd = rd.Add(shift)
		}
		if !wd.IsZero() {
			wd = wd.Add(shift)
		}
		// Deadline errors here mean a closed socket: the next read says so.
		_ = c.raw.SetReadDeadline(rd)
		_ = c.raw.SetWriteDeadline(wd)
	}
	c.done.Store(true)
}

// failed counts a failed handshake and answers a plain HTTP request sent to the TLS port
// with a 400 in plain text, as Go's net/http does, so that `curl http://` says what is wrong
// instead of seeing a reset. A client that closes before sending a byte (a TCP health check
// of a load balancer) is not a failed handshake and is not counted.
func (c *tlsConn) failed(err error) {
	if errors.Is(err, io.EOF) {
		return
	}
	c.ln.errors.Inc()
	var rhe tls.RecordHeaderError
	if errors.As(err, &rhe) && rhe.Conn != nil && looksLikeHTTP(rhe.RecordHeader[:]) {
		_ = rhe.Conn.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = io.WriteString(rhe.Conn, plainHTTPAnswer)
	}
}

// plainHTTPAnswer is the answer to an HTTP request sent to the TLS port.
var plainHTTPAnswer = func() string {
	body := `{"error":"400 Bad Request: this port speaks TLS: use https:// to reach it"}`
	return "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
}()

// looksLikeHTTP reports a TLS record header (its first 5 bytes) that is the start of an
// HTTP/1 request line.
func looksLikeHTTP(hdr []byte) bool {
	switch string(hdr) {
	case "GET /", "HEAD ", "POST ", "PUT /", "DELET", "OPTIO", "PATCH", "CONNE":
		return true
	}
	return false
}

// Read reads application data, after the handshake.
func (c *tlsConn) Read(p []byte) (int, error) {
	if !c.done.Load() {
		if err := c.Handshake(); err != nil {
			return 0, err
		}
	}
	return c.Conn.Read(p)
}

// Write writes application data, after the handshake.
func (c *tlsConn) Write(p []byte) (int, error) {
	if !c.done.Load() {
		if err := c.Handshake(); err != nil {
			return 0, err
		}
	}
	return c.Conn.Write(p)
}

// SetDeadline sets both deadlines (see tlsConn for the handshake).
func (c *tlsConn) SetDeadline(t time.Time) error {
	if c.record(&t, &t) {
		return nil
	}
	return c.raw.SetDeadline(t)
}

// SetReadDeadline sets the read deadline (see tlsConn for the handshake).
func (c *tlsConn) SetReadDeadline(t time.Time) error {
	if c.record(&t, nil) {
		return nil
	}
	return c.raw.SetReadDeadline(t)
}

// SetWriteDeadline sets the write deadline (see tlsConn for the handshake).
func (c *tlsConn) SetWriteDeadline(t time.Time) error {
	if c.record(nil, &t) {
		return nil
	}
	return c.raw.SetWriteDeadline(t)
}

// record keeps deadlines set before the handshake finished; false means apply them now.
func (c *tlsConn) record(rd, wd *time.Time) bool {
	if c.done.Load() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done.Load() {
		return false
	}
	if rd != nil {
		c.rd = *rd
	}
	if wd != nil {
		c.wd = *wd
	}
	return true
}

// NetConn returns the socket below TLS, for what only the kernel can tell (a peer's FIN, the
// bytes it acknowledged) and for the lingering close.
func (c *tlsConn) NetConn() net.Conn { return c.raw }

var (
	_ net.Listener = (*TLS)(nil)
	_ net.Conn     = (*tlsConn)(nil)
)
