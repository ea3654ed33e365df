package listener

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"toron/internal/testnet"
)

// echoServer serves a ProxyListener: each connection gets back "RemoteAddr|first bytes read",
// or nothing when its Read failed (then the error is recorded).
type echoServer struct {
	ln       *ProxyListener
	rejected atomic.Int64

	mu       sync.Mutex
	readErrs []error
}

func startEcho(t *testing.T, allow []netip.Prefix, timeout time.Duration) *echoServer {
	t.Helper()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{}
	s.ln = NewProxyProtocol(tcp, ProxyProtocol{
		Allow:    allow,
		Timeout:  func() time.Duration { return timeout },
		OnReject: func() { s.rejected.Add(1) },
	})
	testnet.Serve(t, s.ln, func(c net.Conn) {
		// Asked before the header arrives: it applies once the header was read.
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 512)
		n, err := c.Read(buf)
		if err != nil {
			s.mu.Lock()
			s.readErrs = append(s.readErrs, err)
			s.mu.Unlock()
			return
		}
		_, _ = io.WriteString(c, c.RemoteAddr().String()+"|"+string(buf[:n]))
	})
	return s
}

func (s *echoServer) addr() string { return s.ln.Addr().String() }

// exchange writes b on a new connection from the local address from (or any) and returns all
// the server answered before closing.
func exchange(t *testing.T, addr, from string, b []byte) (string, error) {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if len(b) > 0 {
		if _, err := c.Write(b); err != nil {
			return "", err
		}
	} else {
		_ = c.(*net.TCPConn).CloseWrite() // the client leaves before any header
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	out, err := io.ReadAll(c)
	return string(out), err
}

var sigV2 = []byte("\r\n\r\n\x00\r\nQUIT\n")

// v2Header builds a PROXY protocol v2 header by hand (the spec's section 2.2 layout).
func v2Header(cmd byte, src, dst netip.AddrPort) []byte {
	b := append([]byte{}, sigV2...)
	b = append(b, 0x20|cmd)
	if !src.IsValid() {
		return append(b, 0x00, 0, 0) // AF_UNSPEC, no address block
	}
	if src.Addr().Is4() {
		b = append(b, 0x11) // TCP over IPv4
		b = binary.BigEndian.AppendUint16(b, 12)
		s4, d4 := src.Addr().As4(), dst.Addr().As4()
		b = append(b, s4[:]...)
		b = append(b, d4[:]...)
	} else {
		b = append(b, 0x21) // TCP over IPv6
		b = binary.BigEndian.AppendUint16(b, 36)
		s16, d16 := src.Addr().As16(), dst.Addr().As16()
		b = append(b, s16[:]...)
		b = append(b, d16[:]...)
	}
	b = binary.BigEndian.AppendUint16(b, src.Port())
	return binary.BigEndian.AppendUint16(b, dst.Port())
}

func TestProxyProtocolV1(t *testing.T) {
	s := startEcho(t, nil, 5*time.Second)
	got, err := exchange(t, s.addr(), "", []byte("PROXY TCP4 203.0.113.7 10.0.0.1 56324 443\r\nhello"))
	if err != nil || got != "203.0.113.7:56324|hello" {
		t.Errorf("v1 TCP4: %q %v", got, err)
	}
	got, err = exchange(t, s.addr(), "", []byte("PROXY TCP6 2001:db8::7 2001:db8::1 4711 443\r\nhi"))
	if err != nil || got != "[2001:db8::7]:4711|hi" {
		t.Errorf("v1 TCP6: %q %v", got, err)
	}
	// UNKNOWN: the receiver uses the socket's own addresses.
	got, err = exchange(t, s.addr(), "", []byte("PROXY UNKNOWN\r\nx"))
	if err != nil || !strings.HasPrefix(got, "127.0.0.1:") || !strings.HasSuffix(got, "|x") {
		t.Errorf("v1 UNKNOWN: %q %v", got, err)
	}
	if n := s.rejected.Load(); n != 0 {
		t.Errorf("rejected %d", n)
	}
}

func TestProxyProtocolV2(t *testing.T) {
	s := startEcho(t, nil, 5*time.Second)
	h := v2Header(0x1, netip.MustParseAddrPort("198.51.100.9:40000"), netip.MustParseAddrPort("10.0.0.1:443"))
	got, err := exchange(t, s.addr(), "", append(h, "GET / HTTP/1.1\r\n"...))
	if err != nil || got != "198.51.100.9:40000|GET / HTTP/1.1\r\n" {
		t.Errorf("v2 TCP4: %q %v", got, err)
	}
	h = v2Header(0x1, netip.MustParseAddrPort("[2001:db8:1::5]:1234"), netip.MustParseAddrPort("[2001:db8::1]:443"))
	got, err = exchange(t, s.addr(), "", append(h, 'z'))
	if err != nil || got != "[2001:db8:1::5]:1234|z" {
		t.Errorf("v2 TCP6: %q %v", got, err)
	}
	// The bytes after the header may come later, in their own segment.
	c, err := net.Dial("tcp", s.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(v2Header(0x1, netip.MustParseAddrPort("198.51.100.10:1"), netip.MustParseAddrPort("10.0.0.1:443")))
	time.Sleep(50 * time.Millisecond)
	c.Write([]byte("later"))
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	out, _ := io.ReadAll(c)
	if string(out) != "198.51.100.10:1|later" {
		t.Errorf("header then data: %q", out)
	}
}

// TestProxyProtocolV2Local: the balancer's own health check (LOCAL) keeps the socket peer.
func TestProxyProtocolV2Local(t *testing.T) {
	s := startEcho(t, nil, 5*time.Second)
	got, err := exchange(t, s.addr(), "", append(v2Header(0x0, netip.AddrPort{}, netip.AddrPort{}), "ping"...))
	if err != nil || !strings.HasPrefix(got, "127.0.0.1:") || !strings.HasSuffix(got, "|ping") {
		t.Errorf("v2 LOCAL: %q %v", got, err)
	}
	// A LOCAL header with an address block: the block is ignored.
	got, err = exchange(t, s.addr(), "", append(v2Header(0x0, netip.MustParseAddrPort("198.51.100.9:1"), netip.MustParseAddrPort("10.0.0.1:2")), "p"...))
	if err != nil || !strings.HasPrefix(got, "127.0.0.1:") {
		t.Errorf("v2 LOCAL with addresses: %q %v", got, err)
	}
}

// TestProxyProtocolRefusals: a connection without a valid header is closed without a byte of
// answer and counted, once.
func TestProxyProtocolRefusals(t *testing.T) {
	s := startEcho(t, nil, 5*time.Second)
	for i, b := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n",            // no header at all
		"PROXY TCP4 203.0.113.7 10.0.0.1 56324\r\n",    // a field missing
		"PROXY TCP4 999.0.113.7 10.0.0.1 1 2\r\nhello", // not an address
		"PROXY TCP4 203.0.113.7 10.0.0.1 1 2\n",        // LF without CR
		string(sigV2) + "\x31\x11\x00\x0c",             // version 3
	} {
		got, err := exchange(t, s.addr(), "", []byte(b))
		if got != "" || (err != nil && !isReset(err)) {
			t.Errorf("case %d: answered %q (%v), want a silent close", i, got, err)
		}
	}
	// The client closes before any header.
	exchange(t, s.addr(), "", nil)
	testnet.Eventually(t, "the condition", func() bool { return s.rejected.Load() == 6 })
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, err := range s.readErrs {
		if !errors.Is(err, io.EOF) {
			t.Errorf("the server's Read failed with %v, want io.EOF (fasthttp closes silently on it)", err)
		}
	}
}

func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

// TestProxyProtocolAllow: the allow list checks the socket peer, never the header's source.
func TestProxyProtocolAllow(t *testing.T) {
	s := startEcho(t, []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}, 5*time.Second)
	header := []byte("PROXY TCP4 127.0.0.2 10.0.0.1 56324 443\r\nhello")
	got, err := exchange(t, s.addr(), "127.0.0.1", header)
	if got != "" || (err != nil && !isReset(err)) {
		t.Errorf("from 127.0.0.1, outside allow: answered %q %v", got, err)
	}
	if n := s.rejected.Load(); n != 1 {
		t.Errorf("rejected %d, want 1", n)
	}
	got, err = exchange(t, s.addr(), "127.0.0.2", []byte("PROXY TCP4 203.0.113.7 10.0.0.1 56324 443\r\nhello"))
	if err != nil || got != "203.0.113.7:56324|hello" {
		t.Errorf("from 127.0.0.2, allowed: %q %v", got, err)
	}
}

// TestProxyProtocolHeaderDeadline: a client that connects and stays silent is cut at the header
// deadline, and meanwhile Accept hands out other connections.
func TestProxyProtocolHeaderDeadline(t *testing.T) {
	s := startEcho(t, nil, 2*time.Second)
	silent, err := net.Dial("tcp", s.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	start := time.Now()
	// A second client is served while the first holds its connection open.
	got, err := exchange(t, s.addr(), "", []byte("PROXY TCP4 203.0.113.7 10.0.0.1 1 2\r\nfast"))
	if err != nil || got != "203.0.113.7:1|fast" {
		t.Errorf("second client: %q %v", got, err)
	}
	if time.Since(start) > 1500*time.Millisecond {
		t.Errorf("the second client waited %v: the silent one blocked Accept", time.Since(start))
	}
	_ = silent.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := silent.Read(make([]byte, 1))
	elapsed := time.Since(start)
	if n != 0 || err == nil {
		t.Errorf("the silent client read %d bytes, %v", n, err)
	}
	if elapsed < 1500*time.Millisecond || elapsed > 6*time.Second {
		t.Errorf("the silent client was cut after %v, want about 2s", elapsed)
	}
	testnet.Eventually(t, "the condition", func() bool { return s.rejected.Load() == 1 })
}

// TestProxyProtocolKeepsDeadlines: the read deadline asked for before the header applies once
// it was read (the header's own deadline does not linger).
func TestProxyProtocolKeepsDeadlines(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := NewProxyProtocol(tcp, ProxyProtocol{Timeout: func() time.Duration { return time.Second }})
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if err := sc.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("PROXY TCP4 203.0.113.7 10.0.0.1 1 2\r\n"))
	go func() {
		time.Sleep(2 * time.Second) // past the header deadline, within the caller's
		c.Write([]byte("x"))
	}()
	buf := make([]byte, 8)
	n, err := sc.Read(buf)
	if err != nil || string(buf[:n]) != "x" {
		t.Errorf("read %q %v: the header deadline was left armed", buf[:n], err)
	}
	if a := sc.RemoteAddr().String(); a != "203.0.113.7:1" {
		t.Errorf("RemoteAddr %s", a)
	}
	if _, ok := sc.(interface{ CloseWrite() error }); !ok {
		t.Error("no CloseWrite: the gateway's lingering close would be skipped")
	}
}

// TestProxyProtocolSplitHeader (SPEC 16): a header split over several TCP segments is read as
// one, until the timeout: segmentation is the network's choice, not the balancer's.
func TestProxyProtocolSplitHeader(t *testing.T) {
	s := startEcho(t, nil, 5*time.Second)
	v2 := v2Header(0x1, netip.MustParseAddrPort("203.0.113.9:4242"), netip.MustParseAddrPort("10.0.0.1:443"))
	for _, tc := range []struct {
		name   string
		chunks []string
		want   string
	}{
		{"v1 in two", []string{"PROXY TCP4 203.0.1", "13.7 10.0.0.1 56324 443\r\nhello"}, "203.0.113.7:56324|hello"},
		{"v1 CR and LF apart", []string{"PROXY TCP4 203.0.113.7 10.0.0.1 56324 443\r", "\nhello"}, "203.0.113.7:56324|hello"},
		{"v1 byte by byte", strings.Split("PROXY TCP6 2001:db8::7 2001:db8::1 4711 443\r\n", ""), "[2001:db8::7]:4711|"},
		{"v1 signature cut", []string{"PRO", "XY TCP4 203.0.113.7 10.0.0.1 1 2\r\nx"}, "203.0.113.7:1|x"},
		{"v2 in two", []string{string(v2[:14]), string(v2[14:]) + "hi"}, "203.0.113.9:4242|hi"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", s.addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			for i, chunk := range tc.chunks {
				if i > 0 {
					time.Sleep(20 * time.Millisecond) // its own segment (Go sets TCP_NODELAY)
				}
				if _, err := io.WriteString(c, chunk); err != nil {
					t.Fatal(err)
				}
			}
			if strings.HasSuffix(tc.want, "|") {
				time.Sleep(20 * time.Millisecond)
				_, _ = io.WriteString(c, "z")
				tc.want += "z"
			}
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			out, err := io.ReadAll(c)
			if err != nil || string(out) != tc.want {
				t.Errorf("got %q %v, want %q", out, err, tc.want)
			}
		})
	}
	if n := s.rejected.Load(); n != 0 {
		t.Errorf("rejected %d split headers", n)
	}
}

// TestProxyProtocolSplitHeaderTimeout: a header that never completes is still bounded by the
// timeout, and one without a line end within 107 bytes is refused at once.
func TestProxyProtocolSplitHeaderTimeout(t *testing.T) {
	s := startEcho(t, nil, 500*time.Millisecond)
	start := time.Now()
	got, err := exchange(t, s.addr(), "", []byte("PROXY TCP4 203.0.113.7 "))
	if d := time.Since(start); got != "" || d < 400*time.Millisecond || d > 5*time.Second {
		t.Errorf("partial header: %q %v after %s, want closed after about 500ms", got, err, d)
	}
	got, err = exchange(t, s.addr(), "", []byte("PROXY "+strings.Repeat("A", 120)))
	if got != "" {
		t.Errorf("overlong v1 header: %q %v", got, err)
	}
	testnet.Eventually(t, "the condition", func() bool { return s.rejected.Load() == 2 })
}

// segmentReader delivers its bytes in reads of at most size bytes (TCP segments).
type segmentReader struct {
	b    []byte
	size int
}

func (r *segmentReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), r.size, len(r.b))
	copy(p, r.b[:n])
	r.b = r.b[n:]
	return n, nil
}

// FuzzProxyHeader: whatever bytes come first on a connection, reading the PROXY header never
// panics, and the result does not depend on how the bytes were segmented: the same header (or
// the same refusal) and the same bytes left for HTTP as when they arrive in one read.
func FuzzProxyHeader(f *testing.F) {
	v2 := v2Header(0x1, netip.MustParseAddrPort("203.0.113.9:4242"), netip.MustParseAddrPort("10.0.0.1:443"))
	for _, seed := range [][]byte{
		[]byte("PROXY TCP4 203.0.113.7 10.0.0.1 56324 443\r\nGET / HTTP/1.1\r\n\r\n"),
		[]byte("PROXY TCP6 2001:db8::7 2001:db8::1 4711 443\r\nhi"),
		[]byte("PROXY UNKNOWN\r\nx"),
		[]byte("PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n"),
		[]byte("PROXY " + strings.Repeat("A", 120)),
		[]byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n"),
		append(append([]byte{}, v2...), "hi"...),
		v2Header(0x0, netip.AddrPort{}, netip.AddrPort{}),
		[]byte("GET / HTTP/1.1\r\n\r\n"),
	} {
		f.Add(seed, uint8(1))
		f.Add(seed, uint8(7))
	}
	f.Fuzz(func(t *testing.T, data []byte, size uint8) {
		whole := bufio.NewReaderSize(bytes.NewReader(data), headerBufferBytes)
		hw, errW := readProxyHeader(whole)
		restW, _ := io.ReadAll(whole)
		seg := bufio.NewReaderSize(&segmentReader{b: data, size: int(size%64) + 1}, headerBufferBytes)
		hs, errS := readProxyHeader(seg)
		restS, _ := io.ReadAll(seg)
		if (errW == nil) != (errS == nil) {
			t.Fatalf("whole: %v, segmented by %d: %v", errW, int(size%64)+1, errS)
		}
		if errW != nil {
			return
		}
		if !hw.EqualsTo(hs) || !bytes.Equal(restW, restS) {
			t.Fatalf("whole: %+v %q, segmented: %+v %q", hw, restW, hs, restS)
		}
	})
}
