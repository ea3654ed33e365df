package gateway

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"toron/socket"

	"github.com/valyala/fasthttp"
)

// fuzzReadBufferBytes mirrors the server's ReadBufferSize at the default max_header_bytes.
const fuzzReadBufferBytes = 8192

// FuzzValidateHeaders parses the input with fasthttp, as the server does before our hook,
// and checks that every header validateHeaders accepts has exactly one framing: never both
// Content-Length and Transfer-Encoding, at most one Content-Length and then a plain decimal
// one, Transfer-Encoding only as a single "chunked", every line ending in CRLF, no folding, no
// control byte, and a request line of the form METHOD SP request-target SP HTTP/1.x. Where
// net/http (the reference parser, and what typical Go upstreams run) also accepts the input,
// it must see the same request line and the same framing. Seeded with the smuggling corpus.
func FuzzValidateHeaders(f *testing.F) {
	for _, c := range loadSmugglingCorpus(f) {
		f.Add(c.req)
	}
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
	f.Add([]byte("POST /a?b=c HTTP/1.0\r\nContent-Length: 00\r\n\r\n"))
	f.Add([]byte("PUT http://a/b HTTP/1.9\r\nHost: a\r\nTransfer-Encoding:\tChunked\t\r\n\r\n"))
	f.Add([]byte("OPTIONS * HTTP/1.1\r\nHost: a\r\nX: \x80\xff\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var h fasthttp.RequestHeader
		if err := h.Read(bufio.NewReaderSize(bytes.NewReader(data), fuzzReadBufferBytes)); err != nil {
			return
		}
		if validateHeaders(&h) != nil {
			return
		}
		checkRequestLine(t, &h)
		cl := checkOneFraming(t, &h)
		checkAgainstNetHTTP(t, &h, cl, data)
	})
}

// checkRequestLine asserts what validRequestLine promises.
func checkRequestLine(t *testing.T, h *fasthttp.RequestHeader) {
	t.Helper()
	proto := string(h.Protocol())
	if len(proto) != 8 || !strings.HasPrefix(proto, "HTTP/1.") || proto[7] < '0' || proto[7] > '9' {
		t.Fatalf("accepted protocol %q", proto)
	}
	for _, c := range h.Method() {
		if !isTokenChar(c) {
			t.Fatalf("accepted method %q", h.Method())
		}
	}
	target := h.RequestURI()
	if len(target) == 0 || bytes.ContainsAny(target, " \t#\\") || bytes.ContainsFunc(target, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		t.Fatalf("accepted request-target %q", target)
	}
}

// checkOneFraming re-reads the raw header section the way the most lenient parser would, so
// that whatever a lenient upstream or intermediary could take for a framing header is counted,
// and returns the framing: the Content-Length, -1 for chunked, -2 for none.
func checkOneFraming(t *testing.T, h *fasthttp.RequestHeader) int {
	t.Helper()
	raw := h.RawHeaders()
	for i, c := range raw {
		switch {
		case c == '\n' && (i == 0 || raw[i-1] != '\r'):
			t.Fatalf("accepted a bare LF at %d in %q", i, raw)
		case c == '\r' && (i+1 == len(raw) || raw[i+1] != '\n'):
			t.Fatalf("accepted a bare CR at %d in %q", i, raw)
		case (c < ' ' && c != '\t' && c != '\r' && c != '\n') || c == 0x7f:
			t.Fatalf("accepted control byte %#x in %q", c, raw)
		}
	}
	var cls, tes [][]byte
	// Lenient: any CR or LF ends a line, names are trimmed of whitespace and compared in any case.
	for _, line := range bytes.FieldsFunc(raw, func(r rune) bool { return r == '\r' || r == '\n' }) {
		if line[0] == ' ' || line[0] == '\t' {
			t.Fatalf("accepted a folded line %q in %q", line, raw)
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			t.Fatalf("accepted a line without a colon %q", line)
		}
		name = bytes.TrimSpace(name)
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			cls = append(cls, value)
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			tes = append(tes, value)
		}
	}
	switch {
	case len(cls)+len(tes) > 1:
		t.Fatalf("accepted %d Content-Length and %d Transfer-Encoding fields in %q", len(cls), len(tes), raw)
	case len(tes) == 1:
		if !bytes.EqualFold(tes[0], []byte("chunked")) {
			t.Fatalf("accepted Transfer-Encoding %q", tes[0])
		}
		if cl := h.ContentLength(); cl != -1 {
			t.Fatalf("Transfer-Encoding: chunked accepted, but fasthttp frames it with %d", cl)
		}
		return -1
	case len(cls) == 1:
		n, err := strconv.ParseUint(string(cls[0]), 10, 63)
		if err != nil || cls[0][0] == '+' {
			t.Fatalf("accepted Content-Length %q", cls[0])
		}
		if cl := h.ContentLength(); int64(cl) != int64(n) {
			t.Fatalf("Content-Length %q accepted, but fasthttp frames it with %d", cls[0], cl)
		}
		return int(n)
	}
	if cl := h.ContentLength(); cl != -2 {
		t.Fatalf("no framing header accepted, but fasthttp frames it with %d", cl)
	}
	return -2
}

// checkAgainstNetHTTP compares the request line and framing with net/http's reading of the
// same bytes, when net/http accepts them too.
func checkAgainstNetHTTP(t *testing.T, h *fasthttp.RequestHeader, cl int, data []byte) {
	t.Helper()
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(data)))
	if err != nil {
		return
	}
	if req.Method != string(h.Method()) || req.RequestURI != string(h.RequestURI()) || req.Proto != string(h.Protocol()) {
		t.Fatalf("request line: fasthttp %q %q %q, net/http %q %q %q",
			h.Method(), h.RequestURI(), h.Protocol(), req.Method, req.RequestURI, req.Proto)
	}
	chunkedNet := len(req.TransferEncoding) == 1 && req.TransferEncoding[0] == "chunked"
	switch {
	case cl == -1 && !chunkedNet:
		t.Fatalf("framing: fasthttp chunked, net/http Content-Length %d, Transfer-Encoding %q", req.ContentLength, req.TransferEncoding)
	case cl >= 0 && (len(req.TransferEncoding) > 0 || req.ContentLength != int64(cl)):
		t.Fatalf("framing: fasthttp Content-Length %d, net/http Content-Length %d, Transfer-Encoding %q", cl, req.ContentLength, req.TransferEncoding)
	case cl == -2 && (len(req.TransferEncoding) > 0 || req.ContentLength != 0):
		t.Fatalf("framing: fasthttp none, net/http Content-Length %d, Transfer-Encoding %q", req.ContentLength, req.TransferEncoding)
	}
}

// FuzzGatewayRequest writes the input to a real gateway (once per chunked mode), followed in
// the same write by a canary request whose path the input cannot know. Whatever the input, the
// gateway must answer or close within its deadlines; once it answered its own 400 it must say nothing
// more and close; and a canary that followed a 400 never reaches the upstream. Seeded with the
// smuggling corpus; its deadlines are short so that inputs that leave a request unfinished
// cost half a second.
func FuzzGatewayRequest(f *testing.F) {
	for _, c := range loadSmugglingCorpus(f) {
		f.Add(c.req)
	}
	rec := &recorder{}
	up := httptest.NewServer(rec)
	f.Cleanup(up.Close)
	upAddr := strings.TrimPrefix(up.URL, "http://")
	var gateways []*testGateway
	for _, mode := range smugglingModes {
		gateways = append(gateways, startGatewayB(f, "read_timeout: 500ms\nwrite_timeout: 1s\n",
			upstreamRoute("/", upAddr, "inbound_chunked_mode: "+mode), false))
	}
	var token [8]byte
	_, _ = rand.Read(token[:])
	canaryPrefix := "/canary-" + hex.EncodeToString(token[:]) + "-"
	var seq atomic.Int64

	f.Fuzz(func(t *testing.T, data []byte) {
		for _, gw := range gateways {
			canary := canaryPrefix + strconv.FormatInt(seq.Add(1), 10)
			exchangeWithCanary(t, gw.addr, data, canary, rec)
		}
	})
}

func exchangeWithCanary(t *testing.T, addr string, data []byte, canary string, rec *recorder) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	payload := append(append([]byte(nil), data...), fmt.Sprintf("GET %s HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", canary)...)
	_, _ = c.Write(payload)

	br := bufio.NewReader(c)
	// closed is the gateway's own rejection with Connection: close (its JSON, a 400 for the
	// headers or for a chunked body, or any other): after it the gateway must say nothing more
	// and close, and the canary must never reach the upstream.
	closed := ""
	answers := 0
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			switch {
			case socket.IsTimeout(err) && answers == 0:
				t.Fatalf("the gateway neither answered nor closed within 5s")
			case socket.IsTimeout(err) && closed != "":
				t.Fatalf("the connection stayed open after the gateway's %s", closed)
			}
			break
		}
		answers++
		body, err := io.ReadAll(resp.Body)
		if closed != "" {
			t.Fatalf("the gateway answered %d after its %s", resp.StatusCode, closed)
		}
		// The gateway's own answers are its JSON; the upstream's are passed on ("ok", or a 400
		// without a body).
		if bytes.HasPrefix(body, []byte(`{"error":"`)) {
			if resp.StatusCode == http.StatusBadRequest && string(body) != badRequestBody && string(body) != badChunkBody {
				t.Fatalf("a 400 with an unknown text: %s", body)
			}
			if resp.StatusCode == http.StatusBadRequest && !resp.Close {
				t.Fatalf("400 without Connection: close")
			}
			if resp.Close {
				closed = fmt.Sprintf("%d %s", resp.StatusCode, body)
			}
		}
		if err != nil {
			break
		}
	}
	got400 := closed != ""
	if !got400 {
		return
	}
	for _, r := range rec.records() {
		if strings.Contains(r.uri, canary) {
			t.Fatalf("the canary that followed the gateway's %s reached the upstream", closed)
		}
	}
}
