package main

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// The isolation scenario (SPEC 10, issue 32): /legacy/reports saturated (every bulkhead slot held
// by a slow upstream call, plus a flood that must be answered 503) while /api and /health are
// measured, against an idle phase of the same round. Toron, nginx and HAProxy (-peers) each run in
// front of their own upstream, and the rounds interleave them: round r measures every peer, in an
// order turned by one each round, each with its idle and its flood phase back to back (idle first
// in odd rounds, flood first in even ones). What a neighbour on the shared machine does to one
// round then weighs on every peer alike and on both phases of a pair, and the figures are the
// per-round ratios flood / idle, as medians with a bootstrap interval (stats.go).

const (
	// isolationRounds is the default number of rounds: with 9 paired values the bootstrap
	// interval of their median excludes one or two disturbed rounds.
	isolationRounds = 9
	// holdDelay is how long a slot holder asks the upstream to wait: it is released at the end
	// of its phase (Upstream.ReleaseReports), this only bounds a holder whose release was lost.
	holdDelay = 5 * time.Minute
)

// isolationPeers are the values of -peers, in their default order.
var isolationPeers = []string{"toron", "nginx", "haproxy"}

// isolationServer is what the isolation scenario measures: the gateway, nginx or HAProxy.
type isolationServer interface {
	URL() string
	PID() int
	PeakRSSBytes() int64
	Stop() error
}

// isoPeer is one server of the run and everything measured on it.
type isoPeer struct {
	name, version string
	up            *Upstream
	srv           isolationServer
	// pids are the server's processes (nginx: the master and its worker), whose CPU time is
	// the CPU figure.
	pids []int
	// released reports whether the /legacy/reports slots are all free again; releasedText
	// says how it knows.
	released     func() bool
	releasedText string

	// One value or batch per round.
	apiIdle, apiFlood, healthIdle, healthFlood, flood, holders [][]vegeta.Result
	p99Idle, p99Flood                                          []float64 // /api p99, ns
	rateIdle, rateFlood                                        []float64 // /api answers 2xx per second
	cpuIdle, cpuFlood                                          []float64 // server CPU µs per /api request
	healthP99Idle, healthP99Flood                              []float64
	leaked                                                     int64 // flood requests that reached the upstream
	checks                                                     []check
	notes                                                      []string
}

// reference makes p the started reference peer srv (nginx, HAProxy). A reference exposes no
// counter: all its bulkhead slots (named so in the report) are free when as many slow calls at
// once all get 200.
func (p *isoPeer) reference(srv isolationServer, version, slots string, bulkhead int) {
	p.srv, p.version = srv, version
	p.released = func() bool { return slotsFree(srv.URL(), bulkhead) }
	p.releasedText = fmt.Sprintf("all %d %s free again (%d concurrent calls answered 200)", bulkhead, slots, bulkhead)
}

// startIsoPeer starts an upstream and the named server in front of it, with its generated files
// and logs in out/isolation-<name>.
func startIsoPeer(o options, name string) (*isoPeer, error) {
	dir, err := o.subdir("isolation-" + name)
	if err != nil {
		return nil, err
	}
	up, err := StartUpstream("127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &isoPeer{name: name, up: up}
	switch name {
	case "nginx":
		var n *Nginx
		if n, err = StartNginx(o.nginx, dir, up.Addr(), o.bulkhead); err == nil {
			p.reference(n, n.Version, "limit_conn slots", o.bulkhead)
		}
	case "haproxy":
		var h *HAProxy
		if h, err = StartHAProxy(o.haproxy, dir, up.Addr(), o.bulkhead); err == nil {
			p.reference(h, h.Version, "slots", o.bulkhead)
		}
	default:
		var t *Toron
		t, err = StartToron(o.toron, dir, RouteOptions{Upstream: up.Addr(), ReportsMaxConcurrency: o.bulkhead})
		if err == nil {
			p.srv, p.version = t, "toron"
			p.released = func() bool { return inflightZero(t, "reports") }
			p.releasedText = `toron_route_inflight{route="reports"} returned to 0`
		}
	}
	if err != nil {
		up.Close()
		return nil, err
	}
	p.pids = append([]int{p.srv.PID()}, childPIDs(p.srv.PID())...)
	fmt.Printf("loadtest isolation: %s (%s) %s, pids %v, upstream %s, files in %s\n", name, p.version, p.srv.URL(), p.pids, up.URL(), dir)
	return p, nil
}

// measured are the loads of both phases: /api (closed loop over -api-conns connections, or
// open loop at -api-rate) and /health.
func (p *isoPeer) measured(o options, tag string) []Load {
	base := p.srv.URL()
	api := Load{Name: "/api " + tag, URL: base + "/api/items", Rate: o.apiRate, Workers: 8, Timeout: 5 * time.Second}
	if o.apiConns > 0 {
		api.Rate, api.Workers = 0, o.apiConns
	}
	return []Load{api, {Name: "/health " + tag, URL: base + "/health", Rate: o.healthRate, Workers: 2, Timeout: 5 * time.Second}}
}

// runPhase runs loads at once for d and returns their results; the CPU ticks that server, the
// measured server's processes, used meanwhile; the share of the machine that processes other
// than the load test and all took, and the hypervisor's (otherCPU); and the phase's wall time.
func runPhase(d time.Duration, all, server []int, loads ...Load) (rs [][]vegeta.Result, ticks int64, other, steal float64, wall time.Duration) {
	c0, t0, w0 := sampleCPU(all...), procTicksOf(server), time.Now()
	rs = RunLoads(d, loads...)
	c1, t1, wall := sampleCPU(all...), procTicksOf(server), time.Since(w0)
	other, steal = otherCPU(c0, c1)
	return rs, t1 - t0, other, steal, wall
}

// phaseCPU is the server's CPU time per /api request answered, in µs.
func phaseCPU(ticks int64, api Summary) float64 {
	if api.Requests == 0 {
		return 0
	}
	return float64(ticks) * (1e6 / clockTicks) / float64(api.Requests)
}

// okRate is the answers in 2xx and 3xx per second of the series' span.
func okRate(s Summary) float64 {
	if s.Span <= 0 {
		return 0
	}
	return float64(s.OK) / s.Span.Seconds()
}

// idlePhase measures /api and /health with the legacy route idle; all are the pids of every
// process of the run, for the other-processes figure.
func (p *isoPeer) idlePhase(o options, all []int) (other, steal float64) {
	rs, ticks, other, steal, _ := runPhase(o.duration, all, p.pids, p.measured(o, "idle")...)
	api, health := Summarize("", rs[0]), Summarize("", rs[1])
	p.apiIdle, p.healthIdle = append(p.apiIdle, rs[0]), append(p.healthIdle, rs[1])
	p.p99Idle, p.healthP99Idle = append(p.p99Idle, float64(api.P99)), append(p.healthP99Idle, float64(health.P99))
	p.rateIdle = append(p.rateIdle, okRate(api))
	p.cpuIdle = append(p.cpuIdle, phaseCPU(ticks, api))
	return other, steal
}

// floodPhase holds every slot of /legacy/reports with slow calls, checks that one more call gets
// 503 at once, then measures /api and /health while the flood runs; at its end the upstream
// answers the holders and the slots must come free.
func (p *isoPeer) floodPhase(o options, round int, all []int) (other, steal float64) {
	base := p.srv.URL()
	wait := holdReports(base, o.bulkhead, holdDelay)
	held := waitFor(5*time.Second, func() bool { return p.up.ReportsWaiting.Load() >= int64(o.bulkhead) })
	code, retryAfter := rejectOnce(base + "/legacy/reports?delay=1ms")
	loads := append(p.measured(o, "flood"),
		Load{Name: "flood", URL: base + "/legacy/reports?delay=1ms", Rate: o.floodRate, Workers: 16, Timeout: 5 * time.Second})
	reportsBefore := p.up.Reports.Load()
	rs, ticks, other, steal, _ := runPhase(o.duration, all, p.pids, loads...)
	// Every slot was held: no flood request may have reached the upstream.
	p.leaked += p.up.Reports.Load() - reportsBefore
	p.up.ReleaseReports()
	hs := wait()
	free := waitFor(5*time.Second, p.released)

	api, health, fl := Summarize("", rs[0]), Summarize("", rs[1]), Summarize("", rs[2])
	p.apiFlood, p.healthFlood, p.flood, p.holders = append(p.apiFlood, rs[0]), append(p.healthFlood, rs[1]), append(p.flood, rs[2]), append(p.holders, hs)
	p.p99Flood, p.healthP99Flood = append(p.p99Flood, float64(api.P99)), append(p.healthP99Flood, float64(health.P99))
	p.rateFlood = append(p.rateFlood, okRate(api))
	p.cpuFlood = append(p.cpuFlood, phaseCPU(ticks, api))
	p.checks = append(p.checks,
		check{fmt.Sprintf("%s round %d: all %d slots of /legacy/reports were held by slow calls", p.name, round, o.bulkhead), held},
		check{fmt.Sprintf("%s round %d: one more call got 503 with Retry-After: 5 (got %d, Retry-After %q)", p.name, round, code, retryAfter),
			code == http.StatusServiceUnavailable && retryAfter == "5"},
		check{fmt.Sprintf("%s round %d: %s", p.name, round, p.releasedText), free})
	p.notes = append(p.notes, fmt.Sprintf("flood %s", fl.ErrorsText()))
	return other, steal
}

// isolation runs the scenario over -peers and reports every peer's figures side by side.
func isolation(o options) error {
	if o.target != "" {
		return fmt.Errorf("loadtest: isolation starts its own servers and upstreams (it must see the slow calls arrive at the upstream); -target is not supported, use -peers")
	}
	var peers []*isoPeer
	stopAll := func() error {
		var first error
		for _, p := range peers {
			if err := p.srv.Stop(); err != nil && first == nil {
				first = err
			}
			p.up.Close()
		}
		return first
	}
	for _, name := range o.peers {
		p, err := startIsoPeer(o, name)
		if err != nil {
			stopAll()
			return err
		}
		peers = append(peers, p)
	}
	// The processes of the measurement, whose CPU time is not "other processes".
	var all []int
	for _, p := range peers {
		all = append(all, p.pids...)
		warmup(o, p.srv.URL()+"/api/items")
	}
	var otherMax, stealMax float64
	var otherRounds []string
	for round := 1; round <= o.rounds; round++ {
		for i := range peers {
			p := peers[(i+round-1)%len(peers)]
			var oi, si, of, sf float64
			if round%2 == 1 {
				oi, si = p.idlePhase(o, all)
				of, sf = p.floodPhase(o, round, all)
			} else {
				of, sf = p.floodPhase(o, round, all)
				oi, si = p.idlePhase(o, all)
			}
			otherMax, stealMax = max(otherMax, oi, of), max(stealMax, si, sf)
			otherRounds = append(otherRounds, fmt.Sprintf("%s %.0f/%.0f", p.name, oi, of))
			r := len(p.p99Idle) - 1
			line := fmt.Sprintf("round %d %s: /api p99 %s → %s (%.2fx), %.0f → %.0f req/s (%+.1f%%), CPU %.1f → %.1f µs per /api request (%.2fx); /health p99 %s → %s; %s; other processes %.0f%% / %.0f%% of the machine, steal %.0f%% / %.0f%%",
				round, p.name, fmtDuration(time.Duration(p.p99Idle[r])), fmtDuration(time.Duration(p.p99Flood[r])), ratioOf(p.p99Flood[r], p.p99Idle[r]),
				p.rateIdle[r], p.rateFlood[r], 100*(ratioOf(p.rateFlood[r], p.rateIdle[r])-1),
				p.cpuIdle[r], p.cpuFlood[r], ratioOf(p.cpuFlood[r], p.cpuIdle[r]),
				fmtDuration(time.Duration(p.healthP99Idle[r])), fmtDuration(time.Duration(p.healthP99Flood[r])),
				p.notes[len(p.notes)-1], oi, of, si, sf)
			fmt.Println(line)
			p.notes[len(p.notes)-1] = line
		}
	}
	rss := make([]int64, len(peers))
	var rejects []string
	for i, p := range peers {
		rss[i] = p.srv.PeakRSSBytes()
		if t, ok := p.srv.(*Toron); ok {
			rejects = nonZero(t.Metrics("toron_rejected_total"))
		}
	}
	runErr := stopAll()
	return isolationReport(o, peers, rss, rejects, otherMax, stealMax, otherRounds, runErr)
}

// isoFigures are one peer's statistics over the rounds.
type isoFigures struct {
	p99, rate, cpu Estimate // per-round flood / idle
	rows           []Summary
}

func (p *isoPeer) figures() isoFigures {
	names := []string{"/api idle", "/api flood", "/health idle", "/health flood", "flood /legacy/reports", "holders /legacy/reports"}
	var rows []Summary
	for i, rounds := range [][][]vegeta.Result{p.apiIdle, p.apiFlood, p.healthIdle, p.healthFlood, p.flood, p.holders} {
		rows = append(rows, SummarizeRounds(p.name+" "+names[i], rounds))
	}
	return isoFigures{
		p99:  medianCI(pairedRatios(p.p99Idle, p.p99Flood)),
		rate: medianCI(pairedRatios(p.rateIdle, p.rateFlood)),
		cpu:  medianCI(pairedRatios(p.cpuIdle, p.cpuFlood)),
		rows: rows,
	}
}

// isolationReport prints and writes the comparison, the per-peer rows and the verdict.
func isolationReport(o options, peers []*isoPeer, rss []int64, rejects []string, otherMax, stealMax float64, otherRounds []string, runErr error) error {
	figs := make([]isoFigures, len(peers))
	var series []Series
	var rows []Summary
	for i, p := range peers {
		figs[i] = p.figures()
		rows = append(rows, figs[i].rows...)
		series = append(series, Series{p.name + " /api idle", slices.Concat(p.apiIdle...)}, Series{p.name + " /api flood", slices.Concat(p.apiFlood...)})
	}
	apiText := fmt.Sprintf("/api closed loop over %d connections", o.apiConns)
	if o.apiConns == 0 {
		apiText = fmt.Sprintf("/api %d req/s", o.apiRate)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n## isolation, %d interleaved rounds: per-round flood / idle, median [%.0f%% bootstrap interval, %d resamples]\n\n", o.rounds, 100*bootstrapLevel, bootstrapResamples)
	b.WriteString("| server | /api p99 idle → flood | p99 flood / idle | /api req/s idle → flood | throughput change | CPU µs per /api request idle → flood | CPU flood / idle | flood answered 503 (reached the upstream) | /api, /health errors | peak RSS |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, p := range peers {
		f, r := figs[i], figs[i].rows
		fmt.Fprintf(&b, "| %s | %s → %s | %s | %.0f → %.0f | %s | %.1f → %.1f | %s | %d of %d (%d) | %d, %d | %s |\n",
			p.version, fmtDuration(time.Duration(median(p.p99Idle))), fmtDuration(time.Duration(median(p.p99Flood))), f.p99,
			median(p.rateIdle), median(p.rateFlood), lossText(f.rate),
			median(p.cpuIdle), median(p.cpuFlood), f.cpu,
			r[4].Errors["503"], r[4].Requests, p.leaked,
			r[0].Requests+r[1].Requests-r[0].OK-r[1].OK, r[2].Requests+r[3].Requests-r[2].OK-r[3].OK, mib(rss[i]))
	}
	table := b.String()

	notes := []string{
		fmt.Sprintf("%s; /health %d req/s; flood %d req/s on /legacy/reports while its %d slots are held; %d rounds of %s idle + %s flood per server; the idle/flood columns are medians of the rounds, the ratios medians of the per-round ratios",
			apiText, o.healthRate, o.floodRate, o.bulkhead, o.rounds, o.duration, o.duration),
		"CPU per /api request: utime+stime of the server's processes over the phase / the /api requests of the phase (the flood's requests are not counted, their cost is in the figure)",
		"toron rejects: " + strings.Join(rejects, ", "),
		fmt.Sprintf("other processes on the machine during a phase (idle/flood): %s; at most %.0f%% of its CPU time, steal at most %.0f%%%s",
			strings.Join(otherRounds, ", "), otherMax, stealMax, disturbedText(otherMax)),
		fmt.Sprintf("machine load average at the end: %s", loadAverage()),
	}
	for _, p := range peers {
		notes = append(notes, p.notes...)
	}
	// One parseable line per peer for scripts/isolation-nginx.sh.
	for i, p := range peers {
		f, r := figs[i], figs[i].rows
		notes = append(notes, fmt.Sprintf("RESULT isolation peer=%s rounds=%d p99_ratio=%.3f p99_ratio_lo=%.3f p99_ratio_hi=%.3f throughput_ratio=%.4f throughput_ratio_lo=%.4f throughput_ratio_hi=%.4f cpu_ratio=%.3f cpu_ratio_lo=%.3f cpu_ratio_hi=%.3f api_p99_idle_ms=%s api_p99_flood_ms=%s api_rps_idle=%.0f api_rps_flood=%.0f cpu_us_idle=%.2f cpu_us_flood=%.2f rounds_p99_idle_ms=%s rounds_p99_flood_ms=%s rounds_rps_idle=%s rounds_rps_flood=%s rounds_cpu_idle=%s rounds_cpu_flood=%s api_errors=%d health_errors=%d flood_requests=%d flood_503=%d flood_at_upstream=%d holders=%d holders_ok=%d peak_rss_mib=%.1f other_cpu_max_pct=%.0f steal_max_pct=%.0f",
			p.name, o.rounds, f.p99.Median, f.p99.Lo, f.p99.Hi, f.rate.Median, f.rate.Lo, f.rate.Hi, f.cpu.Median, f.cpu.Lo, f.cpu.Hi,
			msText(median(p.p99Idle)), msText(median(p.p99Flood)), median(p.rateIdle), median(p.rateFlood), median(p.cpuIdle), median(p.cpuFlood),
			msList(p.p99Idle), msList(p.p99Flood), floatList(p.rateIdle, "%.0f"), floatList(p.rateFlood, "%.0f"), floatList(p.cpuIdle, "%.2f"), floatList(p.cpuFlood, "%.2f"),
			r[0].Requests+r[1].Requests-r[0].OK-r[1].OK, r[2].Requests+r[3].Requests-r[2].OK-r[3].OK,
			r[4].Requests, r[4].Errors["503"], p.leaked, r[5].Requests, r[5].OK, float64(rss[i])/(1<<20), otherMax, stealMax))
	}

	// Toron's checks count; the references' are shown.
	var checks []check
	for i, p := range peers {
		r := figs[i].rows
		cs := append(slices.Clone(p.checks),
			check{fmt.Sprintf("%s /api: no errors (%s idle, %s flood)", p.name, r[0].ErrorsText(), r[1].ErrorsText()), len(r[0].Errors)+len(r[1].Errors) == 0},
			check{fmt.Sprintf("%s /health: no errors (%s idle, %s flood)", p.name, r[2].ErrorsText(), r[3].ErrorsText()), len(r[2].Errors)+len(r[3].Errors) == 0},
			check{fmt.Sprintf("%s flood: every request answered 503 (%s)", p.name, r[4].ErrorsText()), r[4].Requests > 0 && r[4].Errors["503"] == r[4].Requests},
			check{fmt.Sprintf("%s flood: no request reached the upstream (%d did)", p.name, p.leaked), p.leaked == 0},
			check{fmt.Sprintf("%s holders: every slow call answered 200 (%s)", p.name, r[5].ErrorsText()), len(r[5].Errors) == 0})
		if p.name != "toron" {
			lines, _ := verdict(cs)
			for _, l := range lines {
				notes = append(notes, "reference: "+l)
			}
			continue
		}
		f := figs[i]
		cs = append(cs,
			check{fmt.Sprintf("toron /api p99 flood / idle %.2f <= %.2f (per-round median)", f.p99.Median, o.maxRatio), f.p99.Median <= o.maxRatio},
			check{fmt.Sprintf("toron CPU per /api request flood / idle %.3f <= 1.05 (per-round median)", f.cpu.Median), f.cpu.Median <= 1.05})
		for j, q := range peers {
			if q.name == "toron" {
				continue
			}
			g := figs[j]
			cs = append(cs,
				check{fmt.Sprintf("toron /api p99 flood / idle %.2f <= %s's %.2f", f.p99.Median, q.name, g.p99.Median), f.p99.Median <= g.p99.Median},
				check{fmt.Sprintf("toron /api throughput change %+.1f%% >= %s's %+.1f%%", 100*(f.rate.Median-1), q.name, 100*(g.rate.Median-1)), f.rate.Median >= g.rate.Median})
		}
		checks = append(checks, cs...)
	}
	lines, missed := verdict(checks)
	notes = append(notes, lines...)

	title := fmt.Sprintf("isolation: %s; /legacy/reports bulkhead of %d held + flood %d req/s; %s, /health %d req/s; %d interleaved rounds of %s idle + %s flood",
		strings.Join(o.peers, ", "), o.bulkhead, o.floodRate, apiText, o.healthRate, o.rounds, o.duration, o.duration)
	fmt.Print(table)
	if err := report(o, "isolation", title, series, rows, notes, false); err != nil {
		return err
	}
	compare, err := writeOut(o, "isolation-compare.md", table)
	if err != nil {
		return err
	}
	fmt.Printf("comparison: %s\n", compare)
	return firstErr(runErr, missed)
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
