package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// env is what a scenario started: the upstream and the gateway.
type env struct {
	o  options
	up *Upstream
	gw *Toron
}

// setup starts the upstream and the gateway with the generated files in out/<scenario>-toron.
func setup(o options, bulkhead int) (*env, error) {
	dir, err := o.toronDir()
	if err != nil {
		return nil, err
	}
	up, gw, err := startBehindUpstream(func(upstream string) (*Toron, error) {
		return StartToron(o.toron, dir, RouteOptions{Upstream: upstream, ReportsMaxConcurrency: bulkhead})
	})
	if err != nil {
		return nil, err
	}
	fmt.Printf("loadtest %s: upstream %s, gateway %s (pid %d, files in %s)\n",
		o.scenario, up.URL(), gw.URL(), gw.PID(), dir)
	return &env{o: o, up: up, gw: gw}, nil
}

// startBehindUpstream starts the load test's upstream (StartUpstream on a free loopback port)
// and then, with start, which gets the upstream's host:port, a gateway in front of it. When the
// gateway does not start, the upstream is closed again.
func startBehindUpstream(start func(upstream string) (*Toron, error)) (*Upstream, *Toron, error) {
	up, err := StartUpstream("127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	gw, err := start(up.Addr())
	if err != nil {
		up.Close()
		return nil, nil, err
	}
	return up, gw, nil
}

// close stops the gateway (SIGTERM) and the upstream; an unclean gateway exit is an error.
func (e *env) close() error {
	err := e.gw.Stop()
	e.up.Close()
	return err
}

// report prints the table and the notes and writes the table and the plot into the out folder.
func report(o options, name, title string, series []Series, rows []Summary, notes []string, withMBps bool) error {
	var b strings.Builder
	WriteTable(&b, title, rows, withMBps)
	for _, n := range notes {
		b.WriteString(n + "\n")
	}
	fmt.Print(b.String())
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return fmt.Errorf("loadtest: cannot create %s: %w", o.out, err)
	}
	md := filepath.Join(o.out, name+".md")
	if err := os.WriteFile(md, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("loadtest: cannot write %s: %w", md, err)
	}
	plot := filepath.Join(o.out, name+".html")
	if err := WritePlot(plot, title, series, rows, notes); err != nil {
		return err
	}
	fmt.Printf("table: %s\nplot:  %s\n", md, plot)
	return nil
}

// verdict prints PASS or FAIL lines and returns errMissed when any failed.
func verdict(checks []check) ([]string, error) {
	var lines []string
	failed := 0
	for _, c := range checks {
		word := "PASS"
		if !c.ok {
			word = "FAIL"
			failed++
		}
		lines = append(lines, fmt.Sprintf("%s %s", word, c.what))
	}
	if failed > 0 {
		return lines, fmt.Errorf("%w: %d of %d checks failed", errMissed, failed, len(checks))
	}
	return lines, nil
}

type check struct {
	what string
	ok   bool
}

// warmup is a short unrecorded run before a measured phase.
func warmup(o options, url string) {
	Load{URL: url, Rate: 0, Workers: min(o.connections, 16)}.Run(min(time.Second, o.duration/5))
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// smallGet measures GET /api throughput, directly and through the gateway.
func smallGet(o options) error {
	load := func(name, url string) Load {
		return Load{Name: name, URL: url, Rate: o.rate, Workers: o.connections, Timeout: 5 * time.Second}
	}
	var series []Series
	var notes []string
	var runErr error
	if o.target != "" {
		url := o.target + "/api/items"
		warmup(o, url)
		series = append(series, Series{Name: labelOr(o, "target") + " GET /api", Results: load("target", url).Run(o.duration)})
	} else {
		e, err := setup(o, o.bulkhead)
		if err != nil {
			return err
		}
		warmup(o, e.up.URL()+"/api/items")
		direct := load("direct", e.up.URL()+"/api/items").Run(o.duration)
		warmup(o, e.gw.URL()+"/api/items")
		via := load("toron", e.gw.URL()+"/api/items").Run(o.duration)
		series = append(series, Series{"direct GET /api", direct}, Series{"toron GET /api", via})
		rss := e.gw.PeakRSSBytes()
		runErr = e.close()
		d, t := Summarize("", direct), Summarize("", via)
		notes = append(notes,
			fmt.Sprintf("toron / direct: req/s %.2f, p99 %.2f; toron peak RSS %s", t.Rate/d.Rate, float64(t.P99)/float64(d.P99), mib(rss)))
	}
	rows := summarizeAll(series)
	var checks []check
	for _, r := range rows {
		checks = append(checks, check{fmt.Sprintf("%s: no errors (%s)", r.Name, r.ErrorsText()), len(r.Errors) == 0})
	}
	lines, missed := verdict(checks)
	notes = append(notes, lines...)
	rateText := "max rate"
	if o.rate > 0 {
		rateText = fmt.Sprintf("%d req/s", o.rate)
	}
	title := fmt.Sprintf("small-get: GET /api, %s, %d connections, %s per phase", rateText, o.connections, o.duration)
	if err := report(o, "small-get", title, series, rows, notes, false); err != nil {
		return err
	}
	return firstErr(runErr, missed)
}

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

// disturbedCPU is the share of the machine taken by other processes above which a phase's
// latencies say more about them than about the server.
const disturbedCPU = 10

func disturbedText(otherMax float64) string {
	if otherMax > disturbedCPU {
		return fmt.Sprintf(" (WARNING: above %d%%, the rounds were disturbed: the p99 values measure the other processes too; rerun on a quiet machine)", disturbedCPU)
	}
	return ""
}

// rejectOnce makes one request on a new connection and returns its status and Retry-After
// header (0 and "" when it failed).
func rejectOnce(url string) (int, string) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(url)
	if err != nil {
		return 0, ""
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// slotsFree reports whether n report calls of 100 ms at once, each on its own connection, all
// get 200: then none of n slots is still held.
func slotsFree(base string, n int) bool {
	wait := holdReports(base, n, 100*time.Millisecond)
	for _, r := range wait() {
		if r.Code != http.StatusOK || r.Error != "" {
			return false
		}
	}
	return true
}

// msText prints nanoseconds as milliseconds with three decimals.
func msText(ns float64) string { return strconv.FormatFloat(ns/1e6, 'f', 3, 64) }

// msList prints nanosecond values as comma-separated milliseconds.
func msList(ns []float64) string {
	parts := make([]string, len(ns))
	for i, v := range ns {
		parts[i] = msText(v)
	}
	return strings.Join(parts, ",")
}

// holdReports starts n slow report calls, each on its own connection; wait returns their results.
func holdReports(base string, n int, delay time.Duration) (wait func() []vegeta.Result) {
	out := make([]vegeta.Result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			url := base + "/legacy/reports?delay=" + delay.String()
			client := &http.Client{Timeout: delay + 30*time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			r := vegeta.Result{Attack: "holder", Seq: uint64(i), Method: http.MethodGet, URL: url, Timestamp: time.Now()}
			resp, err := client.Get(url)
			if err == nil {
				b, rerr := io.ReadAll(resp.Body)
				resp.Body.Close()
				r.Code, r.BytesIn, err = uint16(resp.StatusCode), uint64(len(b)), rerr
				if err == nil && (r.Code < 200 || r.Code >= 400) {
					r.Error = resp.Status
				}
			}
			r.Latency = time.Since(r.Timestamp)
			if err != nil {
				r.Error = errorText(err)
			}
			out[i] = r
		})
	}
	return func() []vegeta.Result {
		wg.Wait()
		return out
	}
}

// inflightZero reports whether the route's in-flight gauge reads 0.
func inflightZero(gw *Toron, route string) bool {
	for _, l := range gw.Metrics("toron_route_inflight") {
		if strings.Contains(l, `route="`+route+`"`) {
			return strings.HasSuffix(l, " 0")
		}
	}
	return false
}

// waitFor polls cond every 20 ms until it holds or limit passes.
func waitFor(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// slowClient attacks the gateway with trickled bodies, slow headers and slow reads while /api
// and /health are measured, after an idle phase of the same length.
func slowClient(o options) error {
	if o.target != "" {
		return fmt.Errorf("loadtest: slow-client starts its own gateway and upstream; -target is not supported")
	}
	e, err := setup(o, o.bulkhead)
	if err != nil {
		return err
	}
	addr := strings.TrimPrefix(e.gw.URL(), "http://")
	measured := func(tag string) []Load {
		return []Load{
			{Name: "/api " + tag, URL: e.gw.URL() + "/api/items", Rate: o.apiRate, Workers: 8, Timeout: 5 * time.Second},
			{Name: "/health " + tag, URL: e.gw.URL() + "/health", Rate: o.healthRate, Workers: 2, Timeout: 5 * time.Second},
		}
	}
	warmup(o, e.gw.URL()+"/api/items")
	idle := RunLoads(o.duration, measured("idle")...)

	attacks := []SlowClient{
		{Name: "attack: trickled bodies (1 B/s)", Addr: addr, Conns: o.attackers, Interval: time.Second, Kind: "body"},
		{Name: "attack: slow headers (1 line/s)", Addr: addr, Conns: o.attackers, Interval: time.Second, Kind: "headers"},
		{Name: "attack: slow reads (64 B/s of 16 MiB)", Addr: addr, Conns: o.attackers, Interval: time.Second, Kind: "read", ReadBytes: 64, ResponseBytes: 16 << 20},
	}
	attackResults := make([][]vegeta.Result, len(attacks))
	var wg sync.WaitGroup
	for i, a := range attacks {
		wg.Go(func() { attackResults[i] = a.Run(o.duration, slowCutLimit) })
	}
	// Measure while the crowd is at full size: after its first second, for the phase.
	time.Sleep(time.Second)
	under := RunLoads(o.duration, measured("under attack")...)
	wg.Wait()

	rss := e.gw.PeakRSSBytes()
	rejects := e.gw.Metrics("toron_rejected_total")
	runErr := e.close()

	series := []Series{
		{"/api idle", idle[0]}, {"/health idle", idle[1]},
		{"/api under attack", under[0]}, {"/health under attack", under[1]},
	}
	for i, a := range attacks {
		series = append(series, Series{a.Name, attackResults[i]})
	}
	rows := summarizeAll(series)
	notes := []string{
		fmt.Sprintf("attack rows: one request per connection; latency = time until the gateway closed it; an attacker reconnects at once for %s; not-cut = still open after %s", o.duration, slowCutLimit),
		fmt.Sprintf("/api p99 under attack / idle: %.2fx; toron peak RSS %s; rejects: %s",
			float64(rows[2].P99)/float64(rows[0].P99), mib(rss), strings.Join(nonZero(rejects), ", ")),
	}
	checks := []check{
		{fmt.Sprintf("/api under attack: no errors (%s)", rows[2].ErrorsText()), len(rows[2].Errors) == 0},
		{fmt.Sprintf("/health under attack: no errors (%s)", rows[3].ErrorsText()), len(rows[3].Errors) == 0},
	}
	for _, r := range rows[4:] {
		checks = append(checks, check{fmt.Sprintf("%s: every connection cut by the gateway (%s)", r.Name, r.ErrorsText()),
			r.Requests > 0 && r.OK == 0 && r.Errors["not-cut"] == 0})
	}
	lines, missed := verdict(checks)
	notes = append(notes, lines...)
	title := fmt.Sprintf("slow-client: %d connections of each attack; /api %d req/s, /health %d req/s; %s idle + %s under attack",
		o.attackers, o.apiRate, o.healthRate, o.duration, o.duration)
	if err := report(o, "slow-client", title, series, rows, notes, false); err != nil {
		return err
	}
	return firstErr(runErr, missed)
}

// slowCutLimit is how long the slow-client scenario gives a slow connection to be cut: three
// default read_timeout windows (SPEC 5 promises a cut within two).
const slowCutLimit = 15 * time.Second

// serveUpstream serves the upstream alone until SIGINT, SIGTERM or -lifetime.
func serveUpstream(o options) error {
	up, err := StartUpstream(o.listen)
	if err != nil {
		return err
	}
	fmt.Printf("loadtest upstream listening on %s (pid %d)\n", up.URL(), os.Getpid())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-sig:
	case <-time.After(o.lifetime):
		fmt.Fprintf(os.Stderr, "loadtest upstream: -lifetime %s passed, exiting\n", o.lifetime)
	}
	return up.Close()
}

// probe checks every path of a running server every -interval on a new connection, as a load
// balancer's health check does, and reports the share answered 200.
func probe(o options) error {
	if o.target == "" {
		return fmt.Errorf("loadtest: probe needs -target, such as http://127.0.0.1:8080")
	}
	paths := strings.Split(o.paths, ",")
	client := &http.Client{Timeout: o.probeTimeout, Transport: &http.Transport{DisableKeepAlives: true}}
	results := make([][]vegeta.Result, len(paths))
	var mu sync.Mutex
	var wg sync.WaitGroup
	tick := time.NewTicker(o.interval)
	stop := time.After(o.duration)
loop:
	for {
		for i, p := range paths {
			wg.Go(func() {
				r := probeOnce(client, o.target+p)
				mu.Lock()
				results[i] = append(results[i], r)
				mu.Unlock()
			})
		}
		select {
		case <-tick.C:
		case <-stop:
			break loop
		}
	}
	tick.Stop()
	wg.Wait()

	label := labelOr(o, o.target)
	series := make([]Series, len(paths))
	for i, p := range paths {
		series[i] = Series{label + " " + p, results[i]}
	}
	rows := summarizeAll(series)
	var checks []check
	for _, r := range rows {
		checks = append(checks, check{fmt.Sprintf("%s: %.2f%% answered 200 within %s (target >= %.0f%%)", r.Name, r.OKShare(), o.probeTimeout, o.minOKPercent),
			r.OKShare() >= o.minOKPercent})
	}
	lines, missed := verdict(checks)
	title := fmt.Sprintf("probe %s: %s every %s, new connection each, %s timeout, for %s", label, o.paths, o.interval, o.probeTimeout, o.duration)
	name := "probe"
	if o.label != "" {
		name += "-" + o.label
	}
	if err := report(o, name, title, series, rows, lines, false); err != nil {
		return err
	}
	return missed
}

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

func summarizeAll(series []Series) []Summary {
	rows := make([]Summary, len(series))
	for i, s := range series {
		rows[i] = Summarize(s.Name, s.Results)
	}
	return rows
}

// nonZero keeps the metric lines whose value is not 0, without the metric name.
func nonZero(lines []string) []string {
	var out []string
	for _, l := range lines {
		if !strings.HasSuffix(l, " 0") {
			out = append(out, strings.TrimPrefix(l, "toron_rejected_total"))
		}
	}
	if len(out) == 0 {
		return []string{"none"}
	}
	return out
}

func labelOr(o options, def string) string {
	if o.label != "" {
		return o.label
	}
	return def
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
