package main

import (
	"fmt"
	"time"
)

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
	rateText := "max rate"
	if o.rate > 0 {
		rateText = fmt.Sprintf("%d req/s", o.rate)
	}
	title := fmt.Sprintf("small-get: GET /api, %s, %d connections, %s per phase", rateText, o.connections, o.duration)
	return conclude(o, "small-get", title, series, rows, notes, checks, runErr)
}
