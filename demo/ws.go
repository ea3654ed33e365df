package demo

import (
	"bufio"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"strings"
	"sync"
	"time"
)

// The WebSocket echo upstream of the demo's /ws route and of the load test's tunnel scenario
// (SPEC 15): a minimal RFC 6455 server on raw net.Conn, so that neither needs a dependency. It
// answers the opening handshake (section 4.2.2), then, framed (the demo), echoes every text
// and binary frame unmasked (5.1), answers a ping with a pong (5.5.2) and a close with a close
// (5.5.1); or, raw (the load test), echoes the bytes as they come: a tunnel is
// byte-transparent, so framing would only cost the client and the upstream. It is a demo, not
// a library: no extensions, no subprotocols, frames of at most wsMaxFrameBytes.

const (
	// wsMaxFrameBytes bounds one frame's payload; a longer one closes the connection.
	wsMaxFrameBytes = 1 << 20
	// wsIdleTimeout closes a connection silent for this long (longer than the gateway's default
	// tunnel_idle_timeout, so the gateway is the one that closes an idle tunnel).
	wsIdleTimeout = 120 * time.Second
	// wsGUID is the magic string of the accept key (RFC 6455 1.3).
	wsGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
)

// WebSocket opcodes (RFC 6455 5.2).
const (
	wsOpText  = 0x1
	wsOpClose = 0x8
	wsOpPing  = 0x9
	wsOpPong  = 0xA
)

// WSEcho is the echo server: its listener and the connections it serves, for Close.
type WSEcho struct {
	ln  net.Listener
	raw bool
	wg  sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// startWSEcho listens on an ephemeral loopback port and serves the demo's framed echo until
// Close.
func startWSEcho() (*WSEcho, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("demo: cannot listen for the ws upstream on 127.0.0.1: %w", err)
	}
	return ServeWSEcho(ln, false), nil
}

// ServeWSEcho serves the echo on ln until Close. raw echoes the bytes after the handshake as
// they come, and answers a request that is no upgrade (a relay's health check) with a 200;
// otherwise frames are echoed and a plain request gets a 426.
func ServeWSEcho(ln net.Listener, raw bool) *WSEcho {
	s := &WSEcho{ln: ln, raw: raw, conns: make(map[net.Conn]struct{})}
	s.wg.Go(s.accept)
	return s
}

// Addr returns the listener's host:port.
func (s *WSEcho) Addr() string { return s.ln.Addr().String() }

func (s *WSEcho) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Go(func() {
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				_ = c.Close()
			}()
			serveWS(c, s.raw)
		})
	}
}

// Close stops the listener, closes every connection and waits for their goroutines.
func (s *WSEcho) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// serveWS answers one connection: the handshake, then the echo (raw: of bytes, else of frames).
func serveWS(c net.Conn, raw bool) {
	_ = c.SetDeadline(time.Now().Add(headerReadTimeout))
	br := bufio.NewReader(c)
	tp := textproto.NewReader(br)
	line, err := tp.ReadLine()
	if err != nil {
		return
	}
	hdr, err := tp.ReadMIMEHeader()
	if err != nil {
		return
	}
	key := hdr.Get("Sec-Websocket-Key")
	if raw && !strings.EqualFold(hdr.Get("Upgrade"), "websocket") {
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
		return
	}
	if !strings.HasPrefix(line, "GET ") || !strings.EqualFold(hdr.Get("Upgrade"), "websocket") || key == "" {
		_, _ = io.WriteString(c, "HTTP/1.1 426 Upgrade Required\r\nSec-WebSocket-Version: 13\r\nContent-Type: text/plain\r\nContent-Length: 35\r\nConnection: close\r\n\r\nthis upstream speaks WebSocket only")
		return
	}
	if !raw && hdr.Get("Sec-Websocket-Version") != "13" {
		_, _ = io.WriteString(c, "HTTP/1.1 426 Upgrade Required\r\nSec-WebSocket-Version: 13\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		return
	}
	sum := sha1.Sum([]byte(key + wsGUID))
	accept := base64.StdEncoding.EncodeToString(sum[:])
	if _, err := io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: "+accept+"\r\n\r\n"); err != nil {
		return
	}
	if raw {
		_ = c.SetDeadline(time.Time{})
		buf := make([]byte, 64<<10) // as the relay's: the echo must not be what limits either
		_, _ = io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{br}, buf)
		return
	}
	payload := make([]byte, 0, 4<<10)
	for {
		_ = c.SetDeadline(time.Now().Add(wsIdleTimeout))
		fin, op, p, err := readFrame(br, payload[:0])
		if err != nil {
			return
		}
		payload = p
		switch op {
		case wsOpClose:
			_ = writeFrame(c, true, wsOpClose, p)
			return
		case wsOpPing:
			if writeFrame(c, true, wsOpPong, p) != nil {
				return
			}
		case wsOpPong:
		default: // text, binary and their continuations, echoed as they came
			if writeFrame(c, fin, op, p) != nil {
				return
			}
		}
	}
}

// readFrame reads one client frame (masked, RFC 6455 5.3) and unmasks its payload into buf.
func readFrame(br *bufio.Reader, buf []byte) (fin bool, op byte, payload []byte, err error) {
	var h [2]byte
	if _, err = io.ReadFull(br, h[:]); err != nil {
		return
	}
	fin, op = h[0]&0x80 != 0, h[0]&0x0f
	if h[1]&0x80 == 0 {
		return fin, op, nil, errors.New("demo: unmasked client frame")
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var ext [2]byte
		if _, err = io.ReadFull(br, ext[:]); err != nil {
			return
		}
		n = uint64(binary.BigEndian.Uint16(ext[:]))
	case 127:
		var ext [8]byte
		if _, err = io.ReadFull(br, ext[:]); err != nil {
			return
		}
		n = binary.BigEndian.Uint64(ext[:])
	}
	if n > wsMaxFrameBytes {
		return fin, op, nil, fmt.Errorf("demo: frame of %d bytes", n)
	}
	var mask [4]byte
	if _, err = io.ReadFull(br, mask[:]); err != nil {
		return
	}
	payload = append(buf[:0], make([]byte, n)...)
	if _, err = io.ReadFull(br, payload); err != nil {
		return
	}
	for i := range payload {
		payload[i] ^= mask[i%4]
	}
	return fin, op, payload, nil
}

// writeFrame writes one unmasked server frame.
func writeFrame(w io.Writer, fin bool, op byte, payload []byte) error {
	var h [10]byte
	h[0] = op
	if fin {
		h[0] |= 0x80
	}
	n := len(payload)
	hl := 2
	switch {
	case n < 126:
		h[1] = byte(n)
	case n <= 0xffff:
		h[1] = 126
		binary.BigEndian.PutUint16(h[2:], uint16(n))
		hl = 4
	default:
		h[1] = 127
		binary.BigEndian.PutUint64(h[2:], uint64(n))
		hl = 10
	}
	if _, err := w.Write(h[:hl]); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

// wsRoutesTemplate adds the demo's WebSocket and rewriting routes to the route table; the %[n]s
// verbs: 1 api, 2 ws.
const wsRoutesTemplate = `
  # WebSocket tunnels (SPEC 15): upgrades pass to the echo upstream; an open tunnel holds no worker.
  - type: upstream
    prefix: /ws
    target: http://%[2]s
    websocket: true
    tunnel_idle_timeout: 60s

  # Path rewriting (SPEC 16): /billing/invoices reaches the api upstream as /api/v1/invoices.
  - type: upstream
    prefix: /billing
    target: http://%[1]s
    strip_prefix: true
    add_prefix: /api/v1
`

// wsBannerTemplate is the banner's part for the routes above; the %[1]s verb is the gateway URL.
const wsBannerTemplate = `
WebSocket and rewriting:
  /ws       -> ws   WebSocket echo (RFC 6455); an open tunnel holds no worker, 60s idle timeout
  /billing  -> api  strip_prefix + add_prefix /api/v1: /billing/invoices is forwarded as /api/v1/invoices

  # the handshake through the gateway: the upstream's 101 comes back, then the tunnel stays open (Ctrl-C)
  curl --include --no-buffer -H 'Connection: Upgrade' -H 'Upgrade: websocket' -H 'Sec-WebSocket-Version: 13' -H 'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==' %[1]s/ws/

  # a message there and back through the tunnel (a tiny WebSocket client)
  go run ./loadtest -scenario ws-echo -target %[1]s/ws/

  # rewriting: the api upstream reports the path it got, /api/v1/invoices (X-Forwarded-Prefix: /billing)
  curl -s '%[1]s/billing/invoices?page=2'
`
