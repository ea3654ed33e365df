package main

// The upload scenario (issue 5): concurrent large uploads, generated on the fly, straight to the
// upstream, through the gateway and through the two references (helpers.go, relay.go); and the
// upload client it runs (Uploads), which scripts/compare.sh also drives with -target.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

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

var _ io.Reader = (*patternReader)(nil)

// uploadScenario measures concurrent large uploads (issue 5): each round runs o.uploads uploads
// at once straight to the upstream, through the gateway and, for reference, through a naive
// fasthttp proxy and a plain TCP relay, with a Content-Length and then chunked; the ratios are
// medians over the rounds of toron / direct in the same round, so that a disturbance of the
// shared machine weighs on one round, not on the result. The client (this process), the gateway and the
// upstream are three processes, as in production.
func uploadScenario(o options) error {
	spec := UploadSpec{N: o.uploads, Size: o.uploadBytes, Verify: o.verify, Timeout: o.uploadTimeout}
	if o.target != "" {
		spec.Name, spec.URL, spec.Chunked = "target", o.target, o.chunked
		rs := Uploads(spec)
		framing := " (Content-Length)"
		if o.chunked {
			framing = " (chunked)"
		}
		series := []Series{{labelOr(o, "target") + framing, rs}}
		s := Summarize("", rs)
		// One parseable line for scripts/compare.sh.
		notes := []string{fmt.Sprintf("RESULT upload_mbps=%.1f failed=%d", s.MBps(), s.Requests-s.OK)}
		rows := summarizeAll(series)
		lines, missed := verdict(uploadChecks(rows))
		notes = append(notes, lines...)
		if err := report(o, "upload", uploadTitle(o), series, rows, notes, true); err != nil {
			return err
		}
		return missed
	}

	dir, err := o.toronDir()
	if err != nil {
		return err
	}
	up, err := startUpstreamProcess(dir)
	if err != nil {
		return err
	}
	defer up.Stop()
	upAddr := strings.TrimPrefix(up.URL(), "http://")
	gw, err := StartToron(o.toron, dir, RouteOptions{Upstream: upAddr, ReportsMaxConcurrency: o.bulkhead})
	if err != nil {
		return err
	}
	fmt.Printf("loadtest upload: upstream %s (pid %d), gateway %s (pid %d), files in %s\n", up.URL(), up.PID(), gw.URL(), gw.PID(), dir)
	type target struct{ name, url string }
	targets := []target{{"direct", up.URL()}, {"toron", gw.URL()}}
	if o.reference {
		naive, err := startNaiveProxy(dir, upAddr)
		if err != nil {
			gw.Stop()
			return err
		}
		defer naive.Stop()
		relay, err := startTCPRelay(dir, upAddr)
		if err != nil {
			gw.Stop()
			return err
		}
		defer relay.Stop()
		targets = append(targets, target{"naive fasthttp proxy", naive.URL()}, target{"tcp relay", relay.URL()})
	}
	framings := []struct {
		name    string
		chunked bool
	}{{"Content-Length", false}, {"chunked", true}}
	// results[framing][target] holds one batch per round; mbps the same as MB/s.
	results := make([][][][]vegeta.Result, len(framings))
	mbps := make([][][]float64, len(framings))
	for f := range framings {
		results[f] = make([][][]vegeta.Result, len(targets))
		mbps[f] = make([][]float64, len(targets))
	}
	baseRSS := procStatusBytes(gw.PID(), "VmRSS:")
	// A warm-up round of short uploads, not counted: first connections, page faults and TCP
	// buffer growth would otherwise weigh on the first round's first series only.
	for _, fr := range framings {
		for _, tg := range targets {
			w := spec
			w.Name, w.URL, w.Chunked, w.Size = "warm-up", tg.url+"/legacy/upload", fr.chunked, min(spec.Size, warmUpBytes)
			if s := Summarize("", Uploads(w)); s.OK != s.Requests {
				fmt.Printf("upload warm-up: %s (%s) failed: %s\n", tg.name, fr.name, s.ErrorsText())
			}
		}
	}
	for round := 1; round <= o.rounds; round++ {
		for j := range framings {
			// The framings alternate and the order of the targets turns by one each round, so
			// that no series always runs first (on a cold machine) or after the same neighbour.
			f := (j + round) % len(framings)
			fr := framings[f]
			for i := range targets {
				t := (i + round) % len(targets)
				tg := targets[t]
				spec.Name, spec.URL, spec.Chunked = tg.name, tg.url+"/legacy/upload", fr.chunked
				rs := Uploads(spec)
				results[f][t] = append(results[f][t], rs)
				mbps[f][t] = append(mbps[f][t], Summarize("", rs).MBps())
			}
		}
		fmt.Printf("upload round %d/%d: %s\n", round, o.rounds, roundText(framings[0].name, mbps[0], len(mbps[0][0])-1)+"; "+roundText(framings[1].name, mbps[1], len(mbps[1][0])-1))
	}
	peakRSS := gw.PeakRSSBytes()
	runErr := gw.Stop()

	var series []Series
	var rows []Summary
	for f, fr := range framings {
		for t, tg := range targets {
			name := fmt.Sprintf("%s (%s)", tg.name, fr.name)
			series = append(series, Series{name, slices.Concat(results[f][t]...)})
			rows = append(rows, SummarizeRounds(name, results[f][t]))
		}
	}
	// ratioTo is the median over rounds of target t / target base in the same round.
	ratioTo := func(f, t, base int) float64 {
		rs := make([]float64, 0, o.rounds)
		for r := range mbps[f][t] {
			if d := mbps[f][base][r]; d > 0 {
				rs = append(rs, mbps[f][t][r]/d)
			}
		}
		return median(rs)
	}
	ratio := func(f, t int) float64 { return ratioTo(f, t, 0) } // target t / direct
	growth := peakRSS - baseRSS
	rssLimit := int64(o.uploads)*64<<10 + 16<<20
	clRatio, chRatio := ratio(0, 1), ratio(1, 1)
	verifyText := "byte-exact (SHA-256 at the client and at the upstream)"
	if !o.verify {
		verifyText = "counted only (-verify=false: the endpoints do no work per byte, the worst case for any proxy)"
	}
	notes := []string{
		fmt.Sprintf("uploads %s; medians of %d rounds of toron / direct in the same round:", verifyText, o.rounds),
		fmt.Sprintf("  Content-Length %.2f (target >= %.2f), chunked %.2f of direct chunked (target >= %.2f)", clRatio, o.minCLRatio, chRatio, o.minChunkRatio),
	}
	// The references' ratios, 0 without -reference: naive proxy and tcp relay / direct, and
	// toron / tcp relay; index 0 Content-Length, 1 chunked.
	var naive, relay, vsRelay [2]float64
	if o.reference {
		for f := range framings {
			naive[f], relay[f], vsRelay[f] = ratio(f, 2), ratio(f, 3), ratioTo(f, 1, 3)
		}
		notes = append(notes,
			fmt.Sprintf("  naive fasthttp proxy, same rounds: Content-Length %.2f, chunked %.2f (issue 5 measured 0.83 and 0.33)", naive[0], naive[1]),
			fmt.Sprintf("  tcp relay (no parsing, 64 KiB copies: what moving the bytes alone costs), same rounds: Content-Length %.2f, chunked %.2f", relay[0], relay[1]),
			fmt.Sprintf("  toron / tcp relay in the same round: Content-Length %.2f, chunked %.2f", vsRelay[0], vsRelay[1]))
	}
	notes = append(notes,
		fmt.Sprintf("toron RSS before the uploads %s, peak %s: growth %s (limit %d x 64 KiB + 16 MiB = %s)", mib(baseRSS), mib(peakRSS), mib(growth), o.uploads, mib(rssLimit)),
		fmt.Sprintf("RESULT upload verify=%v rounds=%d cl_ratio=%.3f chunked_ratio=%.3f cl_rounds=%s chunked_rounds=%s naive_cl_ratio=%.3f naive_chunked_ratio=%.3f relay_cl_ratio=%.3f relay_chunked_ratio=%.3f toron_relay_cl_ratio=%.3f toron_relay_chunked_ratio=%.3f rss_base_mib=%.1f rss_peak_mib=%.1f rss_growth_mib=%.1f",
			o.verify, o.rounds, clRatio, chRatio, roundRatios(mbps[0]), roundRatios(mbps[1]), naive[0], naive[1], relay[0], relay[1], vsRelay[0], vsRelay[1],
			float64(baseRSS)/(1<<20), float64(peakRSS)/(1<<20), float64(growth)/(1<<20)))
	// The reference's own failures are reported, not counted against Toron.
	var checks []check
	for _, c := range uploadChecks(rows) {
		if (strings.HasPrefix(c.what, "naive") || strings.HasPrefix(c.what, "tcp relay")) && !c.ok {
			notes = append(notes, "WARNING "+c.what+": the reference's ratios are not meaningful")
			continue
		}
		checks = append(checks, c)
	}
	checks = append(checks,
		check{fmt.Sprintf("toron / direct with a Content-Length %.2f >= %.2f", clRatio, o.minCLRatio), clRatio >= o.minCLRatio},
		check{fmt.Sprintf("toron / direct chunked %.2f >= %.2f", chRatio, o.minChunkRatio), chRatio >= o.minChunkRatio},
		check{fmt.Sprintf("toron RSS growth %s <= %s", mib(growth), mib(rssLimit)), baseRSS > 0 && growth <= rssLimit})
	lines, missed := verdict(checks)
	notes = append(notes, lines...)
	if err := report(o, "upload", uploadTitle(o), series, rows, notes, true); err != nil {
		return err
	}
	return firstErr(runErr, missed)
}

// warmUpBytes is the size of the warm-up uploads.
const warmUpBytes = 20_000_000

func uploadTitle(o options) string {
	return fmt.Sprintf("upload: %d concurrent uploads of %d bytes, generated on the fly", o.uploads, o.uploadBytes)
}

// uploadChecks: every upload arrived whole (byte-exact with -verify).
func uploadChecks(rows []Summary) []check {
	var checks []check
	for _, r := range rows {
		checks = append(checks, check{fmt.Sprintf("%s: every upload arrived whole (%s)", r.Name, r.ErrorsText()), len(r.Errors) == 0 && r.Requests > 0})
	}
	return checks
}

// roundText renders one round's MB/s of every target, such as "Content-Length 812/600/640".
func roundText(framing string, mbps [][]float64, round int) string {
	parts := make([]string, len(mbps))
	for t := range mbps {
		parts[t] = fmt.Sprintf("%.0f", mbps[t][round])
	}
	return framing + " MB/s " + strings.Join(parts, "/")
}

// roundRatios renders toron / direct of each round, such as "0.81,0.79,0.84" ("-" for a round
// whose direct series moved nothing).
func roundRatios(mbps [][]float64) string {
	parts := make([]string, len(mbps[0]))
	for r := range mbps[0] {
		parts[r] = "-"
		if mbps[0][r] > 0 {
			parts[r] = fmt.Sprintf("%.2f", mbps[1][r]/mbps[0][r])
		}
	}
	return strings.Join(parts, ",")
}
