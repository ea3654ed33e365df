package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// What the scenarios share: the upstream and the gateway most of them start (setup), the
// unrecorded warm-up before a measured phase, the PASS/FAIL verdict and the report (the table,
// the notes and the plot in -out). Each scenario has its file, with the clients only it uses
// (smallget.go, upload.go, slowclient.go, isolation.go, ...), and the helper scenarios that
// scripts start (upstream, probe, naive-proxy) are in helpers.go; attack.go holds the generators
// several scenarios and tests run: the vegeta load, the batch of uploads and the probes.

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
	md, err := writeOut(o, name+".md", b.String())
	if err != nil {
		return err
	}
	plot := filepath.Join(o.out, name+".html")
	if err := WritePlot(plot, title, series, rows, notes); err != nil {
		return err
	}
	fmt.Printf("table: %s\nplot:  %s\n", md, plot)
	return nil
}

// writeOut writes text into the file name of -out (created when missing) and returns its path.
func writeOut(o options, name, text string) (string, error) {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return "", fmt.Errorf("loadtest: cannot create %s: %w", o.out, err)
	}
	path := filepath.Join(o.out, name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return "", fmt.Errorf("loadtest: cannot write %s: %w", path, err)
	}
	return path, nil
}

// verdict renders the PASS or FAIL line of each check and returns errMissed when any failed.
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

// conclude ends a scenario: the PASS/FAIL lines of checks go under the notes, the report is
// printed and written, and the result is runErr (a started server that did not stop cleanly,
// exit status 1) before errMissed (a check failed, exit status 3).
func conclude(o options, name, title string, series []Series, rows []Summary, notes []string, checks []check, runErr error) error {
	lines, missed := verdict(checks)
	if err := report(o, name, title, series, rows, append(notes, lines...), false); err != nil {
		return err
	}
	return firstErr(runErr, missed)
}

// warmup is a short unrecorded run before a measured phase.
func warmup(o options, url string) {
	Load{URL: url, Rate: 0, Workers: min(o.connections, 16)}.Run(min(time.Second, o.duration/5))
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
