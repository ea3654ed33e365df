package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// The dashboard and the alerts of SPEC 21, checked offline: every expression parses as PromQL
// and names only metrics Toron exports, the dashboard decodes as a Grafana dashboard that takes
// its data source from a variable, and the rules as Prometheus rule groups.
const (
	dashboardFile = "grafana/toron.json"
	alertsFile    = "prometheus/alerts.yaml"
)

// declaredNotYetExported are metrics that SPEC declares and the dashboard or the alerts use,
// whose code lands with another issue: allowed while no Go source of the gateway names them.
// Remove an entry once its issue has landed (TestDeclaredListIsCurrent logs when).
var declaredNotYetExported = map[string]string{}

// grafanaDashboard is the part of Grafana's dashboard JSON model that toron.json uses.
// Decoding is strict: a key not listed here is an error, so a new one is added on purpose.
type grafanaDashboard struct {
	UID           string                    `json:"uid"`
	Title         string                    `json:"title"`
	Description   string                    `json:"description"`
	Tags          []string                  `json:"tags"`
	Editable      bool                      `json:"editable"`
	GraphTooltip  int                       `json:"graphTooltip"`
	SchemaVersion int                       `json:"schemaVersion"`
	Version       int                       `json:"version"`
	Refresh       string                    `json:"refresh"`
	Time          struct{ From, To string } `json:"time"`
	Timezone      string                    `json:"timezone"`
	Templating    struct {
		List []grafanaVariable `json:"list"`
	} `json:"templating"`
	Annotations struct {
		List []json.RawMessage `json:"list"`
	} `json:"annotations"`
	Links  []json.RawMessage `json:"links"`
	Panels []grafanaPanel    `json:"panels"`
}

type grafanaDatasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type grafanaVariable struct {
	Name       string             `json:"name"`
	Label      string             `json:"label"`
	Type       string             `json:"type"`
	Datasource *grafanaDatasource `json:"datasource,omitempty"`
	// Query is the plugin id for a datasource variable ("prometheus"), an object for a query
	// variable.
	Query      json.RawMessage `json:"query"`
	Definition string          `json:"definition,omitempty"`
	Refresh    int             `json:"refresh"`
	IncludeAll bool            `json:"includeAll,omitempty"`
	Multi      bool            `json:"multi,omitempty"`
	AllValue   string          `json:"allValue,omitempty"`
	Sort       int             `json:"sort,omitempty"`
	Hide       int             `json:"hide"`
	Regex      string          `json:"regex,omitempty"`
	Current    json.RawMessage `json:"current"`
}

type grafanaPanel struct {
	ID          int                `json:"id"`
	Type        string             `json:"type"`
	Title       string             `json:"title"`
	Description string             `json:"description,omitempty"`
	Collapsed   bool               `json:"collapsed,omitempty"`
	Datasource  *grafanaDatasource `json:"datasource,omitempty"`
	GridPos     struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID        string             `json:"refId"`
		Datasource   *grafanaDatasource `json:"datasource"`
		Expr         string             `json:"expr"`
		LegendFormat string             `json:"legendFormat"`
	} `json:"targets,omitempty"`
	FieldConfig json.RawMessage `json:"fieldConfig,omitempty"`
	Options     json.RawMessage `json:"options,omitempty"`
	Panels      []grafanaPanel  `json:"panels,omitempty"`
}

// ruleFile is Prometheus's rule file format (rule_files), alerting rules only.
type ruleFile struct {
	Groups []struct {
		Name     string `json:"name"`
		Interval string `json:"interval,omitempty"`
		Rules    []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

func loadDashboard(t *testing.T, b []byte) grafanaDashboard {
	t.Helper()
	var d grafanaDashboard
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s does not decode as the dashboard model: %v", dashboardFile, err)
	}
	return d
}

// grafanaVars are Grafana's interval variables, which PromQL cannot parse where a duration
// goes; the user variables ($instance, $route) stand inside label matchers' strings.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// metricsOf parses expr and returns the metric names it selects, series suffixes of
// histograms (_bucket, _sum, _count) removed.
func metricsOf(expr string) ([]string, error) {
	e, err := promql.ParseExpr(grafanaVars.Replace(expr))
	if err != nil {
		return nil, err
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if m.Name == "__name__" {
					name = m.Value
				}
			}
			names = append(names, name)
		}
		return nil
	})
	return names, nil
}

// promql is Prometheus's own parser with its default options (the functions Prometheus
// accepts without feature flags).
var promql = parser.NewParser(parser.Options{})

// histogramSeries are the suffixes Prometheus gives a histogram's series.
var histogramSeries = []string{"_bucket", "_sum", "_count"}

// exportedMetrics returns the toron_* names that the gateway's Go sources (the parent module,
// tests and deploy/ left out) spell as string literals: SPEC 8 has every metric declared
// once, by its literal name (STYLE 2).
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	lit := regexp.MustCompile(`"(toron_[a-z0-9_]+)"`)
	out := make(map[string]bool)
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "deploy" || d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range lit.FindAllSubmatch(b, -1) {
			out[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 20 {
		t.Fatalf("found only %d metric names in the gateway's sources: the walk is broken", len(out))
	}
	return out
}

// checkMetric says why name is not a metric Toron exports, "" when it is.
func checkMetric(name string, exported map[string]bool) string {
	base := name
	for _, s := range histogramSeries {
		if b, ok := strings.CutSuffix(name, s); ok && exported[b] {
			base = b
		}
	}
	if exported[base] {
		return ""
	}
	if _, ok := declaredNotYetExported[base]; ok {
		return ""
	}
	return fmt.Sprintf("%s is not a metric Toron exports", name)
}

func TestDashboard(t *testing.T) {
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	d := loadDashboard(t, b)
	exported := exportedMetrics(t)
	for _, msg := range dashboardProblems(d, exported) {
		t.Error(msg)
	}
	// No data source uid is written in: the only "uid" values are the dashboard's own and the
	// ${datasource} variable (an exported dashboard of a Grafana carries its data source's uid,
	// which no other Grafana has).
	var raw any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	walkUIDs(raw, "", func(path, uid string) {
		if path != "uid" && uid != "${datasource}" {
			t.Errorf("%s: uid %q is hard-coded; use ${datasource}", path, uid)
		}
	})
}

// dashboardProblems lists what is wrong with d; empty for a good dashboard.
func dashboardProblems(d grafanaDashboard, exported map[string]bool) []string {
	var out []string
	bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if !regexp.MustCompile(`^[A-Za-z0-9_-]{1,40}$`).MatchString(d.UID) {
		bad("uid %q: must be 1-40 letters, digits, - or _ (Grafana's rule)", d.UID)
	}
	if d.Title == "" {
		bad("title is empty")
	}
	if d.SchemaVersion < 36 {
		bad("schemaVersion %d: panels take their data source by uid from 36 on", d.SchemaVersion)
	}
	i := slices.IndexFunc(d.Templating.List, func(v grafanaVariable) bool { return v.Name == "datasource" })
	if i < 0 {
		bad("no templating variable named datasource")
	} else if v := d.Templating.List[i]; v.Type != "datasource" || string(v.Query) != `"prometheus"` {
		bad("variable datasource: type %q, query %s; want type datasource, query \"prometheus\"", v.Type, v.Query)
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != "${datasource}") {
			bad("variable %s: its data source must be ${datasource}", v.Name)
		}
	}
	if len(d.Panels) == 0 {
		bad("no panels")
	}
	ids := map[int]bool{}
	used := map[string]bool{}
	var visit func(p grafanaPanel)
	visit = func(p grafanaPanel) {
		if ids[p.ID] || p.ID == 0 {
			bad("panel %q: id %d missing or used twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Title == "" {
			bad("panel %d has no title", p.ID)
		}
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			bad("panel %q: gridPos %+v outside the 24-column grid", p.Title, p.GridPos)
		}
		for _, c := range p.Panels {
			visit(c)
		}
		if p.Type == "row" {
			return
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			bad("panel %q: datasource %+v, want {prometheus ${datasource}}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			bad("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			if q.Datasource != nil && q.Datasource.UID != "${datasource}" {
				bad("panel %q query %s: datasource uid %q", p.Title, q.RefID, q.Datasource.UID)
			}
			names, err := metricsOf(q.Expr)
			if err != nil {
				bad("panel %q query %s: %v", p.Title, q.RefID, err)
				continue
			}
			if len(names) == 0 {
				bad("panel %q query %s selects no metric", p.Title, q.RefID)
			}
			for _, n := range names {
				used[n] = true
				if msg := checkMetric(n, exported); msg != "" {
					bad("panel %q query %s: %s", p.Title, q.RefID, msg)
				}
			}
		}
	}
	for _, p := range d.Panels {
		visit(p)
	}
	// SPEC 21's list of what the dashboard shows, each by the metric that answers it.
	for _, what := range uncovered(used, map[string]string{
		"requests and errors by route and status": "toron_requests_total",
		"latency percentiles":                     "toron_request_duration_seconds_bucket",
		"rejections by reason":                    "toron_rejected_total",
		"route in-flight":                         "toron_route_inflight",
		"against max_concurrency":                 "toron_route_max_concurrency",
		"workers in use":                          "toron_workers_busy",
		"upstream health per target":              "toron_upstream_healthy",
		"ejections per target":                    "toron_upstream_ejections_total",
		"rate limiting":                           "toron_ratelimit_keys",
		"tunnels":                                 "toron_tunnels_active",
		"certificate expiry":                      "toron_tls_cert_expiry_timestamp_seconds",
	}) {
		bad("no panel shows %s", what)
	}
	return out
}

// uncovered returns "topic (metric)" for each topic of want, a topic to the metric that answers
// it, whose metric is not in used, in order.
func uncovered(used map[string]bool, want map[string]string) []string {
	var out []string
	for topic, metric := range want {
		if !used[metric] {
			out = append(out, fmt.Sprintf("%s (%s)", topic, metric))
		}
	}
	slices.Sort(out)
	return out
}

// walkUIDs calls f for every "uid" string in v, with its JSON path.
func walkUIDs(v any, path string, f func(path, uid string)) {
	switch x := v.(type) {
	case map[string]any:
		for k, c := range x {
			p := k
			if path != "" {
				p = path + "." + k
			}
			if s, ok := c.(string); ok && k == "uid" {
				f(p, s)
				continue
			}
			walkUIDs(c, p, f)
		}
	case []any:
		for i, c := range x {
			walkUIDs(c, fmt.Sprintf("%s[%d]", path, i), f)
		}
	}
}

func TestAlerts(t *testing.T) {
	b, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range alertProblems(b, exportedMetrics(t)) {
		t.Error(msg)
	}
}

// alertProblems lists what is wrong with a rule file; empty for a good one.
func alertProblems(b []byte, exported map[string]bool) []string {
	var out []string
	bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	var rf ruleFile
	if err := yaml.UnmarshalStrict(b, &rf); err != nil {
		return []string{fmt.Sprintf("%s does not decode as a Prometheus rule file: %v", alertsFile, err)}
	}
	if len(rf.Groups) == 0 {
		bad("no rule groups")
	}
	seen := map[string]bool{}
	used := map[string]bool{}
	for _, g := range rf.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			bad("group %q: needs a name and rules", g.Name)
		}
		for _, r := range g.Rules {
			if r.Alert == "" || seen[r.Alert] {
				bad("rule %q: alert name missing or used twice", r.Alert)
			}
			seen[r.Alert] = true
			e, err := promql.ParseExpr(r.Expr)
			if err != nil {
				bad("%s: %v", r.Alert, err)
				continue
			}
			if e.Type() != parser.ValueTypeVector {
				bad("%s: expression is a %s; an alert needs an instant vector", r.Alert, e.Type())
			}
			names, _ := metricsOf(r.Expr)
			for _, n := range names {
				used[n] = true
				if msg := checkMetric(n, exported); msg != "" {
					bad("%s: %s", r.Alert, msg)
				}
			}
			if d, err := time.ParseDuration(r.For); err != nil || d <= 0 {
				bad("%s: for %q must be a positive duration (a one-scrape blip is no alert)", r.Alert, r.For)
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
				bad("%s: severity %q, want critical, warning or info", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				bad("%s: needs a summary and a description", r.Alert)
			}
		}
	}
	// SPEC 21's alerts, each by the metric it watches.
	for _, what := range uncovered(used, map[string]string{
		"certificate expiring within 14 days": "toron_tls_cert_expiry_timestamp_seconds",
		"5xx share":                           "toron_requests_total",
		"workers saturated":                   "toron_workers_busy",
		"targets ejected":                     "toron_upstream_healthy",
		"Redis down":                          "toron_redis_up",
		"spans dropped":                       "toron_tracing_spans_dropped_total",
	}) {
		bad("no alert for %s", what)
	}
	return out
}

// TestChecksCatchMistakes: the checks above fail on the mistakes they exist for.
func TestChecksCatchMistakes(t *testing.T) {
	exported := exportedMetrics(t)
	checkMutants(t, dashboardFile, "", map[string]func(string) string{
		"unknown metric": func(s string) string { return strings.Replace(s, "toron_workers_busy", "toron_workers_bsy", 1) },
		"bad PromQL":     func(s string) string { return strings.Replace(s, "sum by (route, code) (", "sum by (route, code (", 1) },
		"hard-coded uid": func(s string) string {
			return strings.Replace(s, `"uid": "${datasource}"`, `"uid": "P1809F7CD0C75ACF3"`, 1)
		},
		"no uid":         func(s string) string { return strings.Replace(s, `"uid": "toron-gateway"`, `"uid": ""`, 1) },
		"no ds variable": func(s string) string { return strings.Replace(s, `"type": "datasource"`, `"type": "custom"`, 1) },
		"missing topic": func(s string) string {
			return strings.ReplaceAll(s, "toron_tunnels_active", "toron_tunnel_bytes_total")
		},
		"unknown key": func(s string) string {
			return strings.Replace(s, `"title": "Toron gateway"`, `"title": "Toron gateway", "titel": "x"`, 1)
		},
	}, func(b []byte) int {
		var d grafanaDashboard
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&d); err != nil {
			return 1
		}
		problems := len(dashboardProblems(d, exported))
		var raw any
		_ = json.Unmarshal(b, &raw)
		walkUIDs(raw, "", func(path, uid string) {
			if path != "uid" && uid != "${datasource}" {
				problems++
			}
		})
		return problems
	})
	checkMutants(t, alertsFile, "alerts ", map[string]func(string) string{
		"unknown metric": func(s string) string { return strings.Replace(s, "toron_workers_max", "toron_worker_max", 1) },
		"bad PromQL":     func(s string) string { return strings.Replace(s, "== 0", "== ", 1) },
		"range vector":   func(s string) string { return strings.Replace(s, "(toron_redis_up) == 0", "(toron_redis_up[5m])", 1) },
		"unknown key": func(s string) string {
			return strings.Replace(s, "        for: 2m\n", "        for: 2m\n        fro: 1m\n", 1)
		},
		"no severity": func(s string) string { return strings.Replace(s, "severity: info", "severity: page", 1) },
		"missing alert": func(s string) string {
			return strings.Replace(s, "toron_tracing_spans_dropped_total", "toron_tls_handshake_errors_total", 1)
		},
	}, func(b []byte) int { return len(alertProblems(b, exported)) })
}

// checkMutants reads file and runs a subtest (prefix+name) per edit: the edited file must
// differ from the file, and problems must find something wrong in it.
func checkMutants(t *testing.T, file, prefix string, edits map[string]func(string) string, problems func(b []byte) int) {
	t.Helper()
	good, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range edits {
		t.Run(prefix+name, func(t *testing.T) {
			b := edit(string(good))
			if b == string(good) {
				t.Fatal("the edit changed nothing")
			}
			if problems([]byte(b)) == 0 {
				t.Error("the checks found nothing wrong")
			}
		})
	}
}

// TestDeclaredListIsCurrent says (in the test log, without failing: the issue that lands the
// metric should not have to edit this file to pass) when a metric of declaredNotYetExported is
// in the gateway's sources: its allowance has done its job and can go, so that a later rename
// is caught.
func TestDeclaredListIsCurrent(t *testing.T) {
	exported := exportedMetrics(t)
	for name, why := range declaredNotYetExported {
		if exported[name] {
			t.Logf("%s (%s) is exported now: remove it from declaredNotYetExported", name, why)
		}
	}
}

// TestDemoScrape runs the gateway in -demo mode and reads its real /metrics after a few
// requests: every toron_* metric it serves is one the source scan finds (the scan misses
// nothing), and the core metrics of the dashboard are there.
func TestDemoScrape(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(toronBin, "-demo")
	cmd.Env = append(os.Environ(), fmt.Sprintf("TORON_SERVER__PORT=%d", port), "TORON_LOG__ACCESS=false")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	client := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the demo did not answer /health within 30s: %v\n%s", err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, p := range []string{"/api/users", "/nowhere", "/api/users"} {
		if resp, err := client.Get(base + p); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	scraped := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "toron_") {
			continue
		}
		name := line[:strings.IndexAny(line, "{ ")]
		for _, s := range histogramSeries {
			name = strings.TrimSuffix(name, s)
		}
		scraped[name] = true
	}
	exported := exportedMetrics(t)
	for name := range scraped {
		if !exported[name] {
			t.Errorf("/metrics serves %s, which the source scan does not find", name)
		}
	}
	for _, name := range []string{"toron_requests_total", "toron_request_duration_seconds", "toron_rejected_total",
		"toron_workers_busy", "toron_workers_max", "toron_route_inflight", "toron_route_max_concurrency",
		"toron_upstream_healthy", "toron_upstream_requests_total", "toron_connections_open"} {
		if !scraped[name] {
			t.Errorf("the demo's /metrics lacks %s", name)
		}
	}
}
