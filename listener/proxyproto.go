// Package listener is what happens below HTTP on a client connection: the PROXY protocol (this
// file, read first: its header comes before TLS), TLS (tls.go: a certificate store picked by SNI
// and swapped atomically on reload, a handshake deadline counted from the accept), connection
// accounting. It imports only the standard library, fasthttp, the metrics package and the one
// library its job needs (go-proxyproto): never conf, gateway or zap; the gateway turns
// configuration into its small options structs.
package listener

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pires/go-proxyproto"
)

// PROXY protocol v1 and v2 (SPEC 16), for an AWS NLB, HAProxy or another L4 balancer in front:
// every connection must start with a PROXY header, within a deadline counted from the accept,
// from a source in the allow list (the socket peer, never the address inside the header). The
// header is parsed by github.com/pires/go-proxyproto; the wrapping is ours, because of three
// things the library's own Listener and Conn do not do the way a gateway needs:
//
//   - Accept never blocks on a client and never fails for one. The allow list is checked in
//     Accept from the socket peer alone (no I/O), and a refused connection is closed and counted
//     there; the header itself is read lazily, by the first Read, on the connection's own
//     goroutine, so one silent client cannot hold the accept loop (fasthttp accepts on one
//     goroutine and stops serving when Accept returns an error it does not know).
//   - A connection without a valid header is closed without an answer: its Read reports io.EOF,
//     on which fasthttp closes silently, where the library's error would make fasthttp answer
//     400 (through the gateway's error handler). It is counted once, by OnReject.
//   - Write and RemoteAddr never block on the header: fasthttp writes its 503 to a connection
//     beyond Server.Concurrency on the accept goroutine, before anything was read. Before the
//     header RemoteAddr is the socket peer; after it, the header's source (a v2 LOCAL header,
//     the balancer's own health check, and a v1 UNKNOWN one keep the socket peer). fasthttp
//     reads RemoteAddr only after the request's first bytes, so every request sees the
//     header's source.
//
// The header's read deadline replaces, for that read only, whatever read deadline the layers
// above asked for; theirs is put back once the header is read.

// ProxyProtocol configures NewProxyProtocol.
type ProxyProtocol struct {
	// Allow lists the sources (socket peers) that may connect; empty allows every source.
	Allow []netip.Prefix
	// Timeout returns the bound on the wait for the header, counted from the accept; it is
	// called at every accept, so that a reload's value applies to the next connections.
	Timeout func() time.Duration
	// OnReject is called once for every connection closed for its source or its header (the
	// gateway counts toron_rejected_total{reason="proxy_protocol"}); may be nil.
	OnReject func()
}

// ProxyListener wraps a TCP listener whose connections start with a PROXY protocol header.
type ProxyListener struct {
	net.Listener
	allow    []netip.Prefix
	timeout  func() time.Duration
	onReject func()
}

// NewProxyProtocol wraps ln. It must sit directly on the TCP listener, below TLS: the header
// comes before the TLS handshake.
func NewProxyProtocol(ln net.Listener, opts ProxyProtocol) *ProxyListener {
	if opts.Timeout == nil {
		panic("BUG: listener: PROXY protocol without a header timeout")
	}
	return &ProxyListener{Listener: ln, allow: opts.Allow, timeout: opts.Timeout, onReject: opts.OnReject}
}

// Accept returns the next connection from an allowed source; the others are closed and counted
// without any I/O.
func (l *ProxyListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if !l.allowed(c.RemoteAddr()) {
			l.reject()
			_ = c.Close()
			continue
		}
		return &proxyConn{Conn: c, l: l, headerDeadline: time.Now().Add(l.timeout())}, nil
	}
}

func (l *ProxyListener) allowed(a net.Addr) bool {
	if len(l.allow) == 0 {
		return true
	}
	ip := AddrIP(a)
	for _, p := range l.allow {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

func (l *ProxyListener) reject() {
	if l.onReject != nil {
		l.onReject()
	}
}

// AddrIP is the IP of a socket address, IPv4-mapped addresses unmapped, without allocating
// for TCP: the peer the PROXY protocol's allow list and the gateway's trusted proxies match.
func AddrIP(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(t.IP)
		return ip.Unmap()
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// headerBufferBytes holds a whole v1 header (at most v1HeaderMaxBytes, which go-proxyproto
// wants buffered before it parses: bufferV1Line gathers it) and the common v2 ones; longer v2
// TLVs are read in several fills.
const headerBufferBytes = 256

// v1HeaderMaxBytes is the longest v1 header line, CRLF included (the PROXY protocol spec,
// section 2.1: "PROXY UNKNOWN" and two full IPv6 addresses and ports).
const v1HeaderMaxBytes = 107

// readProxyHeader reads a v1 or v2 header from br, in as many reads as it takes.
func readProxyHeader(br *bufio.Reader) (*proxyproto.Header, error) {
	bufferV1Line(br)
	return proxyproto.Read(br)
}

// bufferV1Line makes br hold a v1 header's whole line when its first byte can start one: it
// reads until a line feed or v1HeaderMaxBytes are buffered, in as many reads as the segments
// take (under the header deadline), never past what the socket delivered. go-proxyproto refuses a
// v1 header that it did not find buffered whole (the spec lets a receiver refuse a partial
// header; Toron must not, since segmentation is the network's choice, SPEC 16). A read error is
// left to the parser, which then sees a short line and refuses it.
func bufferV1Line(br *bufio.Reader) {
	first, err := br.Peek(1)
	if err != nil || first[0] != 'P' {
		return
	}
	for {
		have, _ := br.Peek(br.Buffered())
		if bytes.IndexByte(have, '\n') >= 0 || len(have) >= v1HeaderMaxBytes {
			return
		}
		// One more fill: Peek reads until one byte more than now is buffered.
		if _, err := br.Peek(len(have) + 1); err != nil {
			return
		}
	}
}

const (
	statePending uint32 = iota
	stateReady
	stateFailed
)

// proxyConn is one connection of a ProxyListener.
type proxyConn struct {
	net.Conn
	l              *ProxyListener
	headerDeadline time.Time

	once  sync.Once
	state atomic.Uint32
	// br holds the bytes read past the header until they are consumed; then nil. Only the
	// reading goroutine touches it once the header is read.
	br *bufio.Reader
	// peer is what RemoteAddr reports once state is stateReady.
	peer net.Addr

	mu     sync.Mutex
	readDL time.Time // the read deadline asked for while the header was pending
}

// Read reads the header first (once), then the connection's bytes.
func (c *proxyConn) Read(p []byte) (int, error) {
	if c.state.Load() != stateReady && !c.readHeader() {
		return 0, io.EOF
	}
	if c.br != nil {
		n, _ := c.br.Read(p) // only buffered bytes: br is dropped once it is empty
		if c.br.Buffered() == 0 {
			c.br = nil
		}
		return n, nil
	}
	return c.Conn.Read(p)
}

// Write writes to the socket. It never waits for the header: the one writer before any read is
// fasthttp refusing a connection beyond Server.Concurrency (its 503, written on the accept
// goroutine, which must not block on a client's header). Nothing is written to a connection
// whose header was refused.
func (c *proxyConn) Write(p []byte) (int, error) {
	if c.state.Load() == stateFailed {
		return 0, net.ErrClosed
	}
	return c.Conn.Write(p)
}

// readHeader reads and judges the header exactly once, and reports whether it was valid.
func (c *proxyConn) readHeader() bool {
	c.once.Do(c.doReadHeader)
	return c.state.Load() == stateReady
}

func (c *proxyConn) doReadHeader() {
	peer := c.Conn.RemoteAddr()
	br := bufio.NewReaderSize(c.Conn, headerBufferBytes)
	ok := c.Conn.SetReadDeadline(c.headerDeadline) == nil
	var h *proxyproto.Header
	if ok {
		var err error
		h, err = readProxyHeader(br)
		ok = err == nil && h != nil
	}
	if ok && h.Command.IsProxy() && !h.TransportProtocol.IsUnspec() {
		switch a := h.SourceAddr.(type) {
		case *net.TCPAddr:
			peer = a
		case *net.UDPAddr:
			peer = &net.TCPAddr{IP: a.IP, Port: a.Port, Zone: a.Zone}
		}
		// A Unix source has no IP: the socket peer stands, as for LOCAL.
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if !ok {
		c.state.Store(stateFailed)
		c.l.reject()
		_ = c.Conn.Close()
		return
	}
	// Put back the deadline the layers above asked for, before anyone may set another one
	// directly (SetReadDeadline takes this lock while the header is pending).
	_ = c.Conn.SetReadDeadline(c.readDL)
	if br.Buffered() > 0 {
		c.br = br
	}
	c.peer = peer
	c.state.Store(stateReady)
}

// RemoteAddr is the header's source once the header was read, the socket peer before.
func (c *proxyConn) RemoteAddr() net.Addr {
	if c.state.Load() == stateReady {
		return c.peer
	}
	return c.Conn.RemoteAddr()
}

// SetReadDeadline applies t, or keeps it for after the header while that is being read.
func (c *proxyConn) SetReadDeadline(t time.Time) error {
	if c.state.Load() == statePending {
		c.mu.Lock()
		if c.state.Load() == statePending {
			c.readDL = t
			c.mu.Unlock()
			return nil
		}
		c.mu.Unlock()
	}
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline is SetReadDeadline and SetWriteDeadline.
func (c *proxyConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(t)
}

// CloseWrite half-closes the socket (a lingering close after a rejection).
func (c *proxyConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// SyscallConn exposes the socket (the gateway reads its send queue for the slow-read defence).
func (c *proxyConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, syscall.EINVAL
}

var (
	_ net.Listener = (*ProxyListener)(nil)
	_ net.Conn     = (*proxyConn)(nil)
	_ syscall.Conn = (*proxyConn)(nil)
)
