package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"toron/socket"

	"github.com/valyala/fasthttp"
)

// The request-smuggling firewall (SPEC 7), tested from the outside: every case of
// testdata/smuggling (format in its README.txt) is written on a raw TCP connection to a real
// gateway in front of a real net/http upstream, in both inbound chunked modes.

// smuggledRequest follows every reject case in the same write. A gateway that lost track of
// where the rejected request ended would parse it as the next request and forward it.
const (
	smuggledRequest = "GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n"
	smuggledMarker  = "smuggled"
)

// badRequestBody is the exact answer to every case rejected from its headers; badChunkBody to
// every case whose chunked body is malformed.
const (
	badRequestBody = `{"error":"400 Bad Request: malformed request"}`
	badChunkBody   = `{"error":"400 Bad Request: malformed chunked body"}`
)

// smugglingCase is one file of testdata/smuggling.
type smugglingCase struct {
	name   string
	class  string
	expect string // "reject" or "accept"
	status int    // reject: the status answered (400 unless the file says otherwise)
	body   []byte // accept: the decoded body the upstream must receive
	// xfailStatus names a known wrong answer: the status checks may fail (and must, until the
	// line is removed); the safety checks still hold. xfail names a known gap of the whole case.
	xfailStatus string
	xfail       string
	req         []byte
}

// bodyStage reports whether the class's defect is only visible in the body (chunk framing,
// trailers): the upstream may then have seen the headers and part of the body, never a complete
// request. Every other class is decided from the headers: the upstream sees nothing at all.
func (c *smugglingCase) bodyStage() bool { return c.class == "chunk" || c.class == "trailer" }

const smugglingDir = "testdata/smuggling"

func loadSmugglingCorpus(tb testing.TB) []smugglingCase {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join(smugglingDir, "*.req"))
	if err != nil {
		tb.Fatal(err)
	}
	if len(files) == 0 {
		tb.Fatalf("no cases in %s", smugglingDir)
	}
	cases := make([]smugglingCase, 0, len(files))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		c, err := parseSmugglingCase(strings.TrimSuffix(filepath.Base(f), ".req"), data)
		if err != nil {
			tb.Fatalf("%s: %v", f, err)
		}
		cases = append(cases, c)
	}
	return cases
}

// parseSmugglingCase reads the format of testdata/smuggling/README.txt: comment lines, "key:
// value" lines, then the request as Go-quoted string lines (or `repeat N "s"`), concatenated.
func parseSmugglingCase(name string, data []byte) (smugglingCase, error) {
	c := smugglingCase{name: name, status: http.StatusBadRequest}
	var req []byte
	inRequest := false
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimRight(line, " \t\r")
		at := func(err error) error { return fmt.Errorf("line %d: %w", i+1, err) }
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
			continue
		case strings.HasPrefix(line, `"`):
			s, err := strconv.Unquote(line)
			if err != nil {
				return c, at(fmt.Errorf("request line %s: %w", line, err))
			}
			req = append(req, s...)
			inRequest = true
		case strings.HasPrefix(line, "repeat "):
			var n int
			var q string
			rest := strings.TrimPrefix(line, "repeat ")
			sp := strings.IndexByte(rest, ' ')
			if sp < 0 {
				return c, at(errors.New(`want repeat N "s"`))
			}
			n, err := strconv.Atoi(rest[:sp])
			if err != nil || n < 0 || n > 1<<16 {
				return c, at(fmt.Errorf("repeat count %q", rest[:sp]))
			}
			q, err = strconv.Unquote(rest[sp+1:])
			if err != nil {
				return c, at(fmt.Errorf("repeat string: %w", err))
			}
			req = append(req, strings.Repeat(q, n)...)
			inRequest = true
		case inRequest:
			return c, at(fmt.Errorf("unexpected line after the request: %q", line))
		default:
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				return c, at(fmt.Errorf("want key: value, got %q", line))
			}
			v = strings.TrimSpace(v)
			switch strings.TrimSpace(k) {
			case "class":
				c.class = v
			case "expect":
				c.expect = v
			case "xfail":
				c.xfail = v
			case "xfail-status":
				c.xfailStatus = v
			case "status":
				n, err := strconv.Atoi(v)
				if err != nil || n < 400 || n > 599 {
					return c, at(fmt.Errorf("status %q: want a 4xx or 5xx code", v))
				}
				c.status = n
			case "body":
				s, err := strconv.Unquote(v)
				if err != nil {
					return c, at(fmt.Errorf("body: %w", err))
				}
				c.body = []byte(s)
			default:
				return c, at(fmt.Errorf("unknown key %q", k))
			}
		}
	}
	switch {
	case c.class == "":
		return c, errors.New("missing class")
	case c.expect != "reject" && c.expect != "accept":
		return c, fmt.Errorf("expect must be reject or accept, got %q", c.expect)
	case c.expect == "accept" && c.body == nil:
		return c, errors.New("an accept case needs body (\"\" for none)")
	case c.xfail != "" && c.xfailStatus != "":
		return c, errors.New("xfail and xfail-status exclude each other")
	case len(req) == 0:
		return c, errors.New("no request")
	}
	c.req = req
	return c, nil
}

// upstreamRecord is one request that reached the upstream application.
type upstreamRecord struct {
	uri      string
	body     []byte
	complete bool // the body was read to its clean end
}

// recorder is an upstream handler that records every request it sees.
type recorder struct {
	mu   sync.Mutex
	seen []upstreamRecord
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	rec.mu.Lock()
	rec.seen = append(rec.seen, upstreamRecord{uri: r.RequestURI, body: body, complete: err == nil})
	rec.mu.Unlock()
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	_, _ = io.WriteString(w, "ok")
}

func (rec *recorder) records() []upstreamRecord {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]upstreamRecord(nil), rec.seen...)
}

// smugglingModes are the route settings the corpus runs under. normalize buffers these small
// bodies before forwarding them with a Content-Length; passthrough streams them re-chunked.
var smugglingModes = []string{"normalize", "passthrough"}

// TestSmugglingCorpus runs every case of testdata/smuggling in both chunked modes. A reject case
// must get exactly the 400 JSON with Connection: close, the connection must then close without
// another response, no complete request may reach the upstream (none at all when the defect is
// in the headers), and the request that followed in the same write never does. An accept case
// must get 200 with exactly one complete request forwarded, carrying the expected body.
func TestSmugglingCorpus(t *testing.T) {
	cases := loadSmugglingCorpus(t)
	for _, mode := range smugglingModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					var r caseResult
					runSmugglingCase(t, mode, &tc, &r)
					r.report(t, &tc)
				})
			}
		})
	}
}

// caseResult collects the failed checks of one case: answer checks (status, JSON, Connection:
// close announced) apart from safety checks (what reached the upstream, the connection closing,
// nothing answered after the rejection).
type caseResult struct{ answer, safety []string }

func (r *caseResult) answerf(format string, args ...any) {
	r.answer = append(r.answer, fmt.Sprintf(format, args...))
}

func (r *caseResult) safetyf(format string, args ...any) {
	r.safety = append(r.safety, fmt.Sprintf(format, args...))
}

// report fails the test, or skips it for a known gap that still fails the way it is known to.
func (r *caseResult) report(t *testing.T, tc *smugglingCase) {
	t.Helper()
	all := append(append([]string(nil), r.answer...), r.safety...)
	switch {
	case tc.xfail != "" && len(all) == 0:
		t.Errorf("marked xfail (%s) but passed: remove the xfail line", tc.xfail)
	case tc.xfail != "":
		t.Skipf("known gap (%s): %s", tc.xfail, strings.Join(all, "; "))
	case tc.xfailStatus != "" && len(r.safety) > 0:
		for _, f := range all {
			t.Error(f)
		}
	case tc.xfailStatus != "" && len(r.answer) == 0:
		t.Errorf("marked xfail-status (%s) but answered right: remove the xfail-status line", tc.xfailStatus)
	case tc.xfailStatus != "":
		t.Skipf("known wrong answer (%s), safety checks passed: %s", tc.xfailStatus, strings.Join(r.answer, "; "))
	default:
		for _, f := range all {
			t.Error(f)
		}
	}
}

func runSmugglingCase(t *testing.T, mode string, tc *smugglingCase, r *caseResult) {
	rec := &recorder{}
	up := startUpstream(t, rec.ServeHTTP)
	gw := startGateway(t, "read_timeout: 2s\n", upstreamRoute("/", up.addr, "inbound_chunked_mode: "+mode))

	c := dialRaw(t, gw.addr)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	payload := tc.req
	if tc.expect == "reject" {
		payload = append(append([]byte(nil), tc.req...), smuggledRequest...)
	}
	// The gateway may close before it read everything: a failed write is no failure, a
	// missing answer is.
	_, _ = c.Write(payload)

	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	var status int
	var body []byte
	if err != nil {
		r.answerf("no response: %v", err)
	} else {
		status = resp.StatusCode
		body, err = io.ReadAll(resp.Body)
		if err != nil {
			r.answerf("response body: %v", err)
		}
	}
	switch tc.expect {
	case "reject":
		if resp != nil {
			if !rejectionMatches(tc.status, status, body) {
				r.answerf("got %d %q, want %d with the gateway's JSON", status, body, tc.status)
			}
			if !resp.Close {
				r.answerf("%d without Connection: close", status)
			}
		}
		// Nothing may follow: no answer to a smuggled request, and the connection closes.
		rest, err := io.ReadAll(br)
		if len(rest) > 0 {
			r.safetyf("the gateway kept talking after the first response: %q", firstLine(rest))
		}
		if err != nil && socket.IsTimeout(err) {
			r.safetyf("connection left open")
		}
	case "accept":
		if status != http.StatusOK {
			r.answerf("got %d %q, want 200", status, body)
		}
	}
	c.Close()

	// Shutting the upstream down waits for its handlers: every request it accepted is recorded.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = up.srv.Shutdown(ctx)
	seen := rec.records()
	for _, s := range seen {
		if strings.Contains(s.uri, smuggledMarker) {
			r.safetyf("the upstream saw the smuggled request %q (first answer %d)", s.uri, status)
		}
	}
	switch tc.expect {
	case "reject":
		for _, s := range seen {
			if s.complete {
				r.safetyf("the upstream received a complete request %q body %q", s.uri, s.body)
			}
		}
		if !tc.bodyStage() && (len(seen) > 0 || up.conns.Load() > 0) {
			r.safetyf("a header-level reject reached the upstream: %d requests, %d connections", len(seen), up.conns.Load())
		}
	case "accept":
		if len(seen) != 1 {
			r.safetyf("the upstream saw %d requests, want 1", len(seen))
			break
		}
		if !seen[0].complete || !bytes.Equal(seen[0].body, tc.body) {
			r.safetyf("the upstream got body %q (complete %v), want %q", seen[0].body, seen[0].complete, tc.body)
		}
	}
}

// rejectionMatches reports the gateway's own answer with the wanted status: the exact 400 text,
// or any JSON error starting with the status code.
func rejectionMatches(want, got int, body []byte) bool {
	if got != want {
		return false
	}
	if want == http.StatusBadRequest {
		return string(body) == badRequestBody || string(body) == badChunkBody
	}
	return bytes.HasPrefix(body, []byte(`{"error":"`+strconv.Itoa(want)+` `))
}

func firstLine(b []byte) []byte {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		return b[:i]
	}
	return b
}

// TestSmugglingCorpusShape keeps the corpus honest: enough cases, every class present, and
// the valid controls there.
func TestSmugglingCorpusShape(t *testing.T) {
	cases := loadSmugglingCorpus(t)
	perClass := map[string]int{}
	var rejects, accepts int
	for _, c := range cases {
		perClass[c.class]++
		if c.expect == "reject" {
			rejects++
		} else {
			accepts++
		}
	}
	if rejects < 40 {
		t.Errorf("%d reject cases, want at least 40", rejects)
	}
	if accepts < 3 {
		t.Errorf("%d accept cases, want at least 3", accepts)
	}
	for _, class := range []string{"cl-te", "te-cl", "te", "cl-dup", "cl-value", "chunk", "trailer",
		"bare-lf", "obs-fold", "ctl", "request-line", "field-syntax", "host", "percent", "expect", "cl-0", "0-cl", "valid"} {
		if perClass[class] == 0 {
			t.Errorf("no case of class %q", class)
		}
	}
	t.Logf("%d cases (%d reject, %d accept): %v", len(cases), rejects, accepts, perClass)
}

// TestValidateHeadersNoAllocs: the validator runs on every request and must not allocate.
func TestValidateHeadersNoAllocs(t *testing.T) {
	for _, raw := range []string{
		"GET /api/users?id=1 HTTP/1.1\r\nHost: example.com\r\nUser-Agent: curl/8\r\nAccept: */*\r\nX-Request-Id: abc\r\n\r\n",
		"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 12345\r\nContent-Type: application/octet-stream\r\n\r\n",
		"POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
		"GET http://example.com/api HTTP/1.1\r\nHost: example.com\r\n\r\n",
		"OPTIONS * HTTP/1.0\r\n\r\n",
	} {
		var h fasthttp.RequestHeader
		if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		if n := testing.AllocsPerRun(100, func() { _ = validateHeaders(&h) }); n != 0 {
			t.Errorf("%q: %.1f allocations per call, want 0", raw, n)
		}
	}
}
