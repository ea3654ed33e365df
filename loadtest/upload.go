package main

// The upload scenario (issue 5): concurrent large uploads (attack.go's Uploads, generated on the
// fly) straight to the upstream, through the gateway and through the two references (helpers.go,
// relay.go).

import (
	"fmt"
	"slices"
	"strings"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

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
	gw, err := StartToron(o.toron, dir, RouteOptions{Upstream: up.Addr(), ReportsMaxConcurrency: o.bulkhead})
	if err != nil {
		return err
	}
	fmt.Printf("loadtest upload: upstream %s (pid %d), gateway %s (pid %d), files in %s\n", up.URL(), up.PID(), gw.URL(), gw.PID(), dir)
	type target struct{ name, url string }
	targets := []target{{"direct", up.URL()}, {"toron", gw.URL()}}
	if o.reference {
		naive, err := startNaiveProxy(dir, up.Addr())
		if err != nil {
			gw.Stop()
			return err
		}
		defer naive.Stop()
		relay, err := startTCPRelay(dir, up.Addr())
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
