package demo

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"toron/internal/testnet"

	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"
)

// leakOptions: fasthttp refreshes its Date header from one goroutine it starts once and never
// stops.
var leakOptions = []goleak.Option{goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1")}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(settledM{m}, leakOptions...)
}

// settledM runs the tests, then gives fasthttp's worker-pool cleaners time to end: a cleaner
// notices its stopped server only after its next sleep of MaxIdleWorkerDuration, longer than
// goleak's own retries.
type settledM struct{ m *testing.M }

func (s settledM) Run() int {
	code := s.m.Run()
	deadline := time.Now().Add(maxIdleWorkerDuration + 2*time.Second)
	for goleak.Find(leakOptions...) != nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	return code
}

// startUpstreams starts the demo upstreams and closes them when the test ends.
func startUpstreams(t *testing.T) *Upstreams {
	t.Helper()
	u, err := Start()
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := u.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return u
}

// newClient returns an HTTP client over real loopback sockets whose idle connections are closed
// when the test ends.
func newClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// do sends req and returns the status, the Content-Type and the body.
func do(t *testing.T, c *http.Client, req *http.Request) (int, string, []byte) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", req.Method, req.URL, err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), body
}

func newRequest(t *testing.T, method, url string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatalf("NewRequest: %v", err)
	}
	return req
}

func decode(t *testing.T, body []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("body %q is not the expected JSON: %v", body, err)
	}
}

func TestAPI(t *testing.T) {
	u := startUpstreams(t)
	c := newClient(t)
	base := "http://" + u.API

	req := newRequest(t, http.MethodGet, base+"/api/users?page=2", nil)
	req.Header.Set("X-Request-Id", "req-42")
	status, ctype, body := do(t, c, req)
	if status != http.StatusOK || ctype != "application/json" {
		t.Fatalf("GET /api/users: status %d, Content-Type %q, body %s", status, ctype, body)
	}
	var got apiReply
	decode(t, body, &got)
	want := apiReply{Service: "api", Method: "GET", Path: "/api/users", RequestID: "req-42", Instance: "api-1"}
	if got != want {
		t.Errorf("GET /api/users = %+v, want %+v", got, want)
	}

	// A small body is buffered by fasthttp, a large one streams: both are counted.
	for _, n := range []int{0, 1000, 300_000} {
		status, _, body := do(t, c, newRequest(t, http.MethodPost, base+"/api/items", bytes.NewReader(make([]byte, n))))
		var got apiReply
		decode(t, body, &got)
		if status != http.StatusOK || got.Method != "POST" || got.BodyBytes != int64(n) {
			t.Errorf("POST %d bytes: status %d, reply %+v", n, status, got)
		}
	}

	for _, path := range []string{"/apix", "/", "/legacy/reports"} {
		status, _, body := do(t, c, newRequest(t, http.MethodGet, base+path, nil))
		if status != http.StatusNotFound || !bytes.HasPrefix(body, []byte(`{"error":"404 Not Found: `)) {
			t.Errorf("GET %s: status %d, body %s, want 404 JSON", path, status, body)
		}
	}
}

func TestReportDelay(t *testing.T) {
	u := startUpstreams(t)
	c := newClient(t)

	const delay = 300 * time.Millisecond
	req := newRequest(t, http.MethodGet, "http://"+u.Reports+"/legacy/reports/q3?delay="+delay.String(), nil)
	req.Header.Set("X-Request-Id", "r-1")
	start := time.Now()
	status, ctype, body := do(t, c, req)
	elapsed := time.Since(start)
	if status != http.StatusOK || ctype != "application/json" {
		t.Fatalf("status %d, Content-Type %q, body %s", status, ctype, body)
	}
	if elapsed < delay || elapsed > delay+10*time.Second {
		t.Errorf("report took %s, want at least %s and well under %s", elapsed, delay, delay+10*time.Second)
	}
	var got reportReply
	decode(t, body, &got)
	if want := (reportReply{Report: "ready", Delay: "300ms", RequestID: "r-1"}); got != want {
		t.Errorf("reply %+v, want %+v", got, want)
	}
}

func TestReportInvalidQuery(t *testing.T) {
	u := startUpstreams(t)
	c := newClient(t)
	for _, q := range []string{"delay=soon", "delay=-1s", "delay=6m", "delay=15", "size=-1", "size=1k", "size=1073741825"} {
		start := time.Now()
		status, ctype, body := do(t, c, newRequest(t, http.MethodGet, "http://"+u.Reports+"/legacy/reports?"+q, nil))
		var got errorReply
		decode(t, body, &got)
		if status != http.StatusBadRequest || ctype != "application/json" || !strings.HasPrefix(got.Error, "400 Bad Request: ") {
			t.Errorf("?%s: status %d, Content-Type %q, body %s; want a 400 JSON error", q, status, ctype, body)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("?%s: the 400 took %s, want no delay", q, d)
		}
	}
}

func TestReportStreamsPadding(t *testing.T) {
	u := startUpstreams(t)
	c := newClient(t)

	const size = 10 << 20
	resp, err := c.Get(fmt.Sprintf("http://%s/legacy/reports?delay=0s&size=%d", u.Reports, size))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadBytes('\n')
	if err != nil {
		t.Fatalf("reading the report line: %v", err)
	}
	var got reportReply
	decode(t, line, &got)
	if want := (reportReply{Report: "ready", Delay: "0s", SizeBytes: size}); got != want {
		t.Errorf("report line %+v, want %+v", got, want)
	}
	n, err := io.Copy(io.Discard, br)
	if err != nil || n != size {
		t.Errorf("padding: %d bytes, err %v; want %d bytes", n, err, size)
	}
	if resp.ContentLength != int64(len(line))+size {
		t.Errorf("Content-Length %d, want %d", resp.ContentLength, int64(len(line))+size)
	}
}

// TestSlidingDeadline: the first read arms the deadline bodyIdleTimeout ahead, a read within
// half the window leaves it, a later one re-arms it, a failing set is returned, and once Close
// began every read fails with errShuttingDown.
func TestSlidingDeadline(t *testing.T) {
	var set []time.Time
	var setErr error
	done := make(chan struct{})
	d := slidingDeadline{done: done, set: func(at time.Time) error {
		set = append(set, at)
		return setErr
	}}
	before := time.Now()
	if err := d.next(); err != nil || len(set) != 1 || set[0].Before(before.Add(bodyIdleTimeout)) {
		t.Fatalf("first next: %v, deadlines set %v; want one, bodyIdleTimeout ahead", err, set)
	}
	if err := d.next(); err != nil || len(set) != 1 {
		t.Fatalf("next right after: %v, deadlines set %v; want none more", err, set)
	}
	d.armed = d.armed.Add(-bodyIdleTimeout/2 - time.Second)
	setErr = io.ErrClosedPipe // the connection is gone
	if err := d.next(); err != setErr || len(set) != 2 {
		t.Fatalf("next past half the window: %v, deadlines set %v; want a second one and its error", err, set)
	}
	close(done)
	if err := d.next(); err != errShuttingDown || len(set) != 2 {
		t.Fatalf("next after Close: %v, deadlines set %v; want errShuttingDown and none more", err, set)
	}
}

func TestUploadSink(t *testing.T) {
	u := startUpstreams(t)
	c := newClient(t)

	body := make([]byte, 5_000_000)
	if _, err := rand.Read(body); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	small := []byte("hello")
	smallSum := sha256.Sum256(small)

	for _, tc := range []struct {
		name    string
		path    string
		body    io.Reader // a reader net/http cannot size is sent chunked
		want    uploadReply
		wantSum [32]byte
	}{
		{"content-length", "/legacy/upload", bytes.NewReader(body),
			uploadReply{Bytes: int64(len(body)), ContentLength: len(body), Path: "/legacy/upload"}, sum},
		{"chunked", "/legacy/stream-upload/x", io.MultiReader(bytes.NewReader(body)),
			uploadReply{Bytes: int64(len(body)), TransferEncoding: "chunked", ContentLength: -1, Path: "/legacy/stream-upload/x"}, sum},
		{"small buffered", "/legacy/upload", bytes.NewReader(small),
			uploadReply{Bytes: int64(len(small)), ContentLength: len(small), Path: "/legacy/upload"}, smallSum},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, ctype, resp := do(t, c, newRequest(t, http.MethodPost, "http://"+u.Upload+tc.path, tc.body))
			if status != http.StatusOK || ctype != "application/json" {
				t.Fatalf("status %d, Content-Type %q, body %s", status, ctype, resp)
			}
			var got uploadReply
			decode(t, resp, &got)
			want := tc.want
			want.Method = "POST"
			want.SHA256 = hex.EncodeToString(tc.wantSum[:])
			if got != want {
				t.Errorf("reply %+v\nwant  %+v", got, want)
			}
		})
	}
}

// TestCloseWithReportInFlight: a report waiting out a minute must not hold Close.
func TestCloseWithReportInFlight(t *testing.T) {
	u, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = u.Close() }) // a no-op once the test closed it
	c := newClient(t)

	type result struct {
		status int
		err    error
	}
	res := make(chan result, 1)
	go func() {
		resp, err := c.Get("http://" + u.Reports + "/legacy/reports?delay=1m")
		if err != nil {
			res <- result{err: err}
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		res <- result{status: resp.StatusCode}
	}()
	testnet.Eventually(t, "the report to wait", func() bool { return u.reportsWaiting.Load() == 1 })

	start := time.Now()
	if err := u.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %s with a report in flight, want under 5s", d)
	}
	select {
	case r := <-res:
		if r.err == nil && r.status != http.StatusServiceUnavailable {
			t.Errorf("the waiting report got status %d, want 503 or a closed connection", r.status)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting report did not end after Close")
	}
	if err := u.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestCloseCutsStalledConnections: an upload that stopped sending and a download nobody reads
// are cut after the grace, not waited for.
func TestCloseCutsStalledConnections(t *testing.T) {
	u, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = u.Close() }) // a no-op once the test closed it

	upload, err := net.Dial("tcp", u.Upload)
	if err != nil {
		t.Fatal(err)
	}
	defer upload.Close()
	// Headers and 100 KB of a declared 1 MB body, then silence.
	if _, err := fmt.Fprintf(upload, "POST /legacy/upload HTTP/1.1\r\nHost: demo\r\nContent-Length: 1000000\r\n\r\n%s",
		make([]byte, 100_000)); err != nil {
		t.Fatal(err)
	}

	download, err := net.Dial("tcp", u.Reports)
	if err != nil {
		t.Fatal(err)
	}
	defer download.Close()
	if _, err := io.WriteString(download, "GET /legacy/reports?delay=0s&size=1073741824 HTTP/1.1\r\nHost: demo\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	// Let both requests reach their handlers and the socket buffers fill.
	time.Sleep(300 * time.Millisecond)

	start := time.Now()
	if err := u.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %s with stalled connections, want under 5s", d)
	}
}

// TestCloseRightAfterStart: a Close that runs before the Serve goroutines registered their
// listeners still ends every server.
func TestCloseRightAfterStart(t *testing.T) {
	for range 20 {
		u, err := Start()
		if err != nil {
			t.Fatal(err)
		}
		closed := make(chan error, 1)
		go func() { closed <- u.Close() }()
		if err := testnet.Ended(t, "Close right after Start", 5*time.Second, closed); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}

func TestRoutesYAML(t *testing.T) {
	u := startUpstreams(t)

	type route struct {
		Type                  string `yaml:"type"`
		Prefix                string `yaml:"prefix"`
		Target                string `yaml:"target"`
		MaxBodyBytes          int64  `yaml:"max_body_bytes"`
		MaxConcurrency        int    `yaml:"max_concurrency"`
		ReadTimeout           string `yaml:"read_timeout"`
		WriteTimeout          string `yaml:"write_timeout"`
		ResponseHeaderTimeout string `yaml:"response_header_timeout"`
		InboundChunkedMode    string `yaml:"inbound_chunked_mode"`
		StreamRequestBody     *bool  `yaml:"stream_request_body"`

		Targets   []demoTarget `yaml:"targets"`
		Balance   string       `yaml:"balance"`
		RateLimit struct {
			RequestsPerSecond float64 `yaml:"requests_per_second"`
			Burst             float64 `yaml:"burst"`
		} `yaml:"rate_limit"`
		Websocket         bool           `yaml:"websocket"`
		TunnelIdleTimeout string         `yaml:"tunnel_idle_timeout"`
		StripPrefix       bool           `yaml:"strip_prefix"`
		AddPrefix         string         `yaml:"add_prefix"`
		Auth              map[string]any `yaml:"auth"`

		Compress        bool           `yaml:"compress"`
		CORS            map[string]any `yaml:"cors"`
		ResponseHeaders map[string]any `yaml:"response_headers"`
		To              string         `yaml:"to"`
		Status          int            `yaml:"status"`
	}
	var doc struct {
		Routes []route `yaml:"routes"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(u.RoutesYAML()))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("RoutesYAML does not parse: %v\n%s", err, u.RoutesYAML())
	}

	yes := true
	want := []route{
		{Type: "upstream", Prefix: "/legacy/upload", Target: "http://" + u.Upload,
			MaxBodyBytes: 209715200, MaxConcurrency: 16, ReadTimeout: "10s", StreamRequestBody: &yes, Balance: "least_request"},
		{Type: "upstream", Prefix: "/api", Targets: []demoTarget{{"http://" + u.API}, {"http://" + u.API2}}},
		{Type: "upstream", Prefix: "/legacy/reports", Target: "http://" + u.Reports,
			MaxConcurrency: 8, ResponseHeaderTimeout: "60s", WriteTimeout: "30s"},
		{Type: "upstream", Prefix: "/legacy/stream-upload", Target: "http://" + u.Upload,
			InboundChunkedMode: "passthrough", MaxBodyBytes: 524288000, ReadTimeout: "15s", StreamRequestBody: &yes},
		{Type: "upstream", Prefix: "/api/limited", Target: "http://" + u.API},
		{Type: "upstream", Prefix: "/ws", Target: "http://" + u.WS, Websocket: true, TunnelIdleTimeout: "60s"},
		{Type: "upstream", Prefix: "/billing", Target: "http://" + u.API, StripPrefix: true, AddPrefix: "/api/v1"},
		{Type: "upstream", Prefix: "/api/catalog", Target: "http://" + u.API, Compress: true},
		{Type: "upstream", Prefix: "/api/public", Target: "http://" + u.API,
			CORS:            map[string]any{"allow_origins": []any{"https://app.example.com"}, "allow_methods": []any{"GET", "POST"}, "allow_headers": []any{"Content-Type"}, "max_age": "10m"},
			ResponseHeaders: map[string]any{"set": map[string]any{"X-Served-By": "toron {route}"}}},
		{Type: "redirect", Prefix: "/old-api", To: "/api/users?from={path}", Status: 301},
		{Type: "upstream", Prefix: "/api/private", Target: "http://" + u.API},
		{Type: "upstream", Prefix: "/api/token", Target: "http://" + u.API},
	}
	for i, kind := range map[int]string{len(want) - 2: "basic", len(want) - 1: "jwt"} {
		if i < len(doc.Routes) && doc.Routes[i].Auth[kind] == nil {
			t.Errorf("routes[%d]: auth %v, want a %s block", i, doc.Routes[i].Auth, kind)
		}
	}
	for i := range doc.Routes {
		doc.Routes[i].Auth = nil
	}
	want[4].RateLimit.RequestsPerSecond, want[4].RateLimit.Burst = 1, 3
	if len(doc.Routes) != len(want) {
		t.Fatalf("%d routes, want %d", len(doc.Routes), len(want))
	}
	for i, got := range doc.Routes {
		w := want[i]
		if (got.StreamRequestBody == nil) != (w.StreamRequestBody == nil) ||
			(got.StreamRequestBody != nil && *got.StreamRequestBody != *w.StreamRequestBody) {
			t.Errorf("routes[%d] (%s): stream_request_body %v, want %v", i, got.Prefix, got.StreamRequestBody, w.StreamRequestBody)
		}
		got.StreamRequestBody, w.StreamRequestBody = nil, nil
		if !reflect.DeepEqual(got, w) {
			t.Errorf("routes[%d] = %+v\nwant        %+v", i, got, w)
		}
	}
}

func TestBanner(t *testing.T) {
	u := startUpstreams(t)
	b := u.Banner("http://127.0.0.1:8080/")
	for _, s := range []string{
		u.API, u.Reports, u.Upload,
		"curl -s http://127.0.0.1:8080/health",
		"http://127.0.0.1:8080/metrics | grep toron_",
		"'http://127.0.0.1:8080/legacy/reports?delay=15s'",
		"head -c 5242880 /dev/zero | curl",
		"-H 'Transfer-Encoding: chunked' http://127.0.0.1:8080/legacy/stream-upload",
		"-w '%{http_code}\\n'",
		"-w '%{http_code} ' http://127.0.0.1:8080/api/limited/x",
		"-H 'Upgrade: websocket' -H 'Sec-WebSocket-Version: 13' -H 'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==' http://127.0.0.1:8080/ws/",
		"go run ./loadtest -scenario ws-echo -target http://127.0.0.1:8080/ws/",
		"'http://127.0.0.1:8080/billing/invoices?page=2'",
		"curl -s -H 'Accept-Encoding: zstd' -o /dev/null -w '%{size_download} bytes zstd\\n' 'http://127.0.0.1:8080/api/catalog?items=500'",
		"-H 'Access-Control-Request-Method: POST' http://127.0.0.1:8080/api/public/items",
		"curl -si 'http://127.0.0.1:8080/old-api/v1/users'",
	} {
		if !strings.Contains(b, s) {
			t.Errorf("banner lacks %q:\n%s", s, b)
		}
	}
	if strings.Contains(b, "%!") || strings.Contains(b, "8080//") {
		t.Errorf("banner has a formatting error:\n%s", b)
	}
}

func TestTracingBanner(t *testing.T) {
	off := TracingBanner("http://127.0.0.1:8080", "", 0.01)
	if !strings.Contains(off, "TORON_SERVER__TRACING__ENDPOINT=http://127.0.0.1:4318/v1/traces") {
		t.Errorf("tracing off: the banner does not say how to turn it on:\n%s", off)
	}
	on := TracingBanner("http://127.0.0.1:8080", "http://c:4318/v1/traces", 0.5)
	if !strings.Contains(on, "0.5 of new requests go to http://c:4318/v1/traces") || !strings.Contains(on, "http://127.0.0.1:8080/api/users") || strings.Contains(on, "%!") {
		t.Errorf("tracing on:\n%s", on)
	}
}
