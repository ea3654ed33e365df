package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// probe checks every path of a running server every -interval on a new connection, as a load
// balancer's health check does, and reports the share answered 200.
func probe(o options) error {
	if o.target == "" {
		return fmt.Errorf("loadtest: probe needs -target, such as http://127.0.0.1:8080")
	}
	paths := strings.Split(o.paths, ",")
	client := &http.Client{Timeout: o.probeTimeout, Transport: &http.Transport{DisableKeepAlives: true}}
	results := probeEvery(client, o.target, paths, o.interval, o.duration, nil)

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
