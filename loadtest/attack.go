package main

import (
	"net/http"
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
