package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// Load is one vegeta attack: GET url at Rate per second (0: as fast as Workers allow), with
// Header on every request when it is not nil.
type Load struct {
	Name    string
	URL     string
	Rate    int
	Workers int
	Timeout time.Duration
	Header  http.Header
}

// maxRateWorkers bounds the workers vegeta may add to keep a constant rate while responses are
// slow: a rate of 200/s with 1 s answers needs about 200.
const maxRateWorkers = 2000

// Run attacks for d and returns every result, bodies and headers dropped to keep memory small.
func (l Load) Run(d time.Duration) []vegeta.Result {
	workers := max(1, l.Workers)
	maxWorkers := uint64(maxRateWorkers)
	if l.Rate == 0 {
		maxWorkers = uint64(workers)
	}
	timeout := l.Timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	atk := vegeta.NewAttacker(
		vegeta.Workers(uint64(workers)),
		vegeta.MaxWorkers(maxWorkers),
		vegeta.Connections(workers),
		vegeta.Timeout(timeout),
		vegeta.KeepAlive(true),
		vegeta.MaxBody(0),
		vegeta.Redirects(vegeta.NoFollow),
	)
	tr := vegeta.NewStaticTargeter(vegeta.Target{Method: http.MethodGet, URL: l.URL, Header: l.Header})
	var rs []vegeta.Result
	for r := range atk.Attack(tr, vegeta.Rate{Freq: l.Rate, Per: time.Second}, d, l.Name) {
		r.Body, r.Headers = nil, nil
		rs = append(rs, *r)
	}
	return rs
}

// RunLoads runs loads at once for d; the results are in the order of loads.
func RunLoads(d time.Duration, loads ...Load) [][]vegeta.Result {
	out := make([][]vegeta.Result, len(loads))
	var wg sync.WaitGroup
	for i, l := range loads {
		wg.Go(func() { out[i] = l.Run(d) })
	}
	wg.Wait()
	return out
}

// UploadSpec is a batch of concurrent uploads.
type UploadSpec struct {
	Name string
	URL  string
	// N uploads of Size bytes each run at once, generated on the fly (nothing is stored).
	N    int
	Size int64
	// Chunked sends the bodies with Transfer-Encoding: chunked instead of a Content-Length.
	Chunked bool
	// Verify makes each upload byte-exact: the client hashes (SHA-256) what it generates, the
	// upstream what it receives, and an upload whose hashes differ fails. Without it the
	// upstream only counts (?verify=none) and only the byte count is checked.
	Verify  bool
	Timeout time.Duration
}

// Uploads runs the batch. Each result's BytesOut is what was sent; an upload whose upstream
// did not report exactly Size bytes (and, with Verify, the same SHA-256) is an error.
func Uploads(spec UploadSpec) []vegeta.Result {
	tr := &http.Transport{
		DisableCompression: true,
		WriteBufferSize:    256 << 10,
		ReadBufferSize:     64 << 10,
		MaxConnsPerHost:    spec.N,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	url := spec.URL
	if !spec.Verify {
		url += "?verify=none"
	}
	out := make([]vegeta.Result, spec.N)
	var wg sync.WaitGroup
	for i := range spec.N {
		wg.Go(func() { out[i] = upload(client, url, spec, uint64(i)) })
	}
	wg.Wait()
	return out
}

func upload(client *http.Client, url string, spec UploadSpec, seq uint64) vegeta.Result {
	res := vegeta.Result{Attack: spec.Name, Seq: seq, Method: http.MethodPost, URL: url, Timestamp: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), spec.Timeout)
	defer cancel()
	body := &patternReader{left: spec.Size}
	if spec.Verify {
		body.h = sha256.New()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, body)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	if spec.Chunked {
		req.ContentLength = -1
		req.TransferEncoding = []string{"chunked"}
	} else {
		req.ContentLength = spec.Size
	}
	resp, err := client.Do(req)
	res.BytesOut = uint64(body.sent)
	if err != nil {
		res.Latency = time.Since(res.Timestamp)
		res.Error = errorText(err)
		return res
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	res.Latency = time.Since(res.Timestamp)
	res.BytesIn = uint64(len(b))
	res.Code = uint16(resp.StatusCode)
	if err != nil {
		res.Error = errorText(err)
		return res
	}
	if resp.StatusCode != http.StatusOK {
		res.Error = resp.Status
		return res
	}
	var got struct {
		Bytes  int64  `json:"bytes"`
		SHA256 string `json:"sha256"`
	}
	err = json.Unmarshal(b, &got)
	switch {
	case err != nil || got.Bytes != spec.Size:
		// The status was 200 but the body did not arrive whole: count it as a failure.
		res.Code = 0
		res.Error = fmt.Sprintf("short: the upstream received %d of %d bytes (%s)", got.Bytes, spec.Size, strings.TrimSpace(string(b)))
	case body.h != nil && got.SHA256 != hex.EncodeToString(body.h.Sum(nil)):
		res.Code = 0
		res.Error = fmt.Sprintf("corrupt: the upstream received %d bytes with SHA-256 %q, the client sent %x", got.Bytes, got.SHA256, body.h.Sum(nil))
	}
	return res
}

// patternBlock is the content of generated upload bodies.
var patternBlock = []byte(strings.Repeat("toron-loadtest-upload-0123456789abcdefghijklmnopqrstuvwxyz-ABCDEF\n", 1024))

// patternReader yields left bytes of patternBlock repeated, counts what was read and, when h
// is set, hashes it.
type patternReader struct {
	left, sent int64
	off        int
	h          hash.Hash
}

func (p *patternReader) Read(b []byte) (int, error) {
	if p.left <= 0 {
		return 0, io.EOF
	}
	n := 0
	for n < len(b) && p.left > 0 {
		chunk := patternBlock[p.off:]
		if int64(len(chunk)) > p.left {
			chunk = chunk[:p.left]
		}
		m := copy(b[n:], chunk)
		p.off = (p.off + m) % len(patternBlock)
		n += m
		p.left -= int64(m)
	}
	p.sent += int64(n)
	if p.h != nil {
		p.h.Write(b[:n])
	}
	return n, nil
}

// probeEvery probes base+path for every path at once, every interval, for d, each probe on a
// goroutine of its own so that a slow answer delays no other probe, and returns the results of
// each path; tick, unless nil, runs after each round of probes has started. It returns when the
// last probe has ended.
func probeEvery(client *http.Client, base string, paths []string, interval, d time.Duration, tick func()) [][]vegeta.Result {
	results := make([][]vegeta.Result, len(paths))
	var mu sync.Mutex
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(interval)
	defer t.Stop()
	end := time.After(d)
	for {
		for i, p := range paths {
			wg.Go(func() {
				r := probeOnce(client, base+p)
				mu.Lock()
				results[i] = append(results[i], r)
				mu.Unlock()
			})
		}
		if tick != nil {
			tick()
		}
		select {
		case <-t.C:
		case <-end:
			return results
		}
	}
}

// probeOnce makes one GET on a new connection (client keeps none alive); an answer other than
// 200 is an error.
func probeOnce(client *http.Client, url string) vegeta.Result {
	r := vegeta.Result{Attack: "probe", Method: http.MethodGet, URL: url, Timestamp: time.Now()}
	resp, err := client.Get(url)
	if err == nil {
		var n int64
		n, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		r.Code, r.BytesIn = uint16(resp.StatusCode), uint64(n)
		if resp.StatusCode != http.StatusOK {
			r.Error = resp.Status
		}
	}
	r.Latency = time.Since(r.Timestamp)
	if err != nil {
		r.Code = 0
		r.Error = errorText(err)
	}
	return r
}

var _ io.Reader = (*patternReader)(nil)
