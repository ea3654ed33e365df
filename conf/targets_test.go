package conf

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// withoutPool clears the upstream-pool part of an Effective, for tests about the rest.
func withoutPool(e Effective) Effective {
	e.Targets, e.Balance, e.PassiveHealth, e.HealthCheck, e.Retries = nil, "", PassiveHealth{}, nil, 0
	e.LatencyDecay, e.DiscoveryRefresh = 0, 0
	return e
}

// poolRoute is a route entry with the given pool keys, in block style (nested keys).
func poolRoute(keys string) string {
	return "routes:\n  - type: upstream\n    prefix: /api\n" + keys
}

const twoTargets = `    targets:
      - {url: "http://10.0.0.1:8080", weight: 3}
      - {url: "http://API.internal:8080"}
`

func TestTargetsDefaults(t *testing.T) {
	t.Parallel()
	cfg := mustLoad(t, "", poolRoute(twoTargets))
	r := cfg.Routes[0]
	e := r.Effective
	wantTargets := []EffectiveTarget{{URL: "http://10.0.0.1:8080", Addr: "10.0.0.1:8080", Weight: 3}, {URL: "http://API.internal:8080", Addr: "api.internal:8080", Weight: 1}}
	if !reflect.DeepEqual(e.Targets, wantTargets) {
		t.Errorf("targets %+v, want %+v", e.Targets, wantTargets)
	}
	if r.Target != "http://10.0.0.1:8080" {
		t.Errorf("Target = %q, want the first target's URL for the single-target path", r.Target)
	}
	want := PassiveHealth{ConsecutiveFailures: 5, EjectTime: 30 * time.Second, MaxEjectTime: 300 * time.Second, MaxEjectedPercent: 50}
	if e.Balance != "p2c" || e.PassiveHealth != want || e.HealthCheck != nil || e.Retries != 1 {
		t.Errorf("effective pool %q %+v %+v %d, want p2c, SPEC 13 passive defaults, no checks, 1 retry", e.Balance, e.PassiveHealth, e.HealthCheck, e.Retries)
	}

	// One target is targets with one entry; retries are capped at the other targets (none).
	one := mustLoad(t, "", route(`type: upstream, prefix: /api, target: "http://127.0.0.1:9001", retries: 3`)).Routes[0].Effective
	if len(one.Targets) != 1 || one.Targets[0].Addr != "127.0.0.1:9001" || one.Targets[0].Weight != 1 || one.Retries != 0 {
		t.Errorf("one target: %+v retries %d", one.Targets, one.Retries)
	}
}

func TestTargetsExplicitValues(t *testing.T) {
	t.Parallel()
	cfg := mustLoad(t, "", poolRoute(twoTargets+`    balance: client_ip_hash
    retries: 0
    passive_health: {consecutive_failures: 0, eject_time: 10s}
    health_check:
      path: /healthz?deep=1
      interval: 5s
      unhealthy_threshold: 1
`))
	e := cfg.Routes[0].Effective
	if e.Balance != "client_ip_hash" || e.Retries != 0 {
		t.Errorf("balance %q retries %d", e.Balance, e.Retries)
	}
	if p := e.PassiveHealth; p != (PassiveHealth{ConsecutiveFailures: 0, EjectTime: 10 * time.Second, MaxEjectTime: 300 * time.Second, MaxEjectedPercent: 50}) {
		t.Errorf("passive %+v", p)
	}
	want := HealthCheck{Path: "/healthz?deep=1", Interval: 5 * time.Second, Timeout: 2 * time.Second, HealthyThreshold: 2, UnhealthyThreshold: 1}
	if e.HealthCheck == nil || *e.HealthCheck != want {
		t.Errorf("health_check %+v, want %+v", e.HealthCheck, want)
	}
}

func TestTargetsValidationErrors(t *testing.T) {
	t.Parallel()
	const api = `type: upstream, prefix: /api`
	const tg = `targets: [{url: "http://10.0.0.1:80"}, {url: "http://10.0.0.2:80"}]`
	cases := []struct {
		name, routes, want, key string
	}{
		{"both target and targets", route(api + `, target: "http://10.0.0.9:80", ` + tg),
			`routes.yaml: routes[0] (/api): targets: a route has either target or targets, not both (targets: [{url: "http://10.0.0.9:80"}, ...] replaces target)`, "targets"},
		{"neither", route(api), "routes.yaml: routes[0] (/api): target: is required (http://host:port or https://host:port)", "target"},
		{"targets empty", route(api + ", targets: []"), "routes.yaml: routes[0] (/api): targets: must be a list of at least one {url, weight} entry, not a list", "targets"},
		{"targets not a list", route(api + ", targets: http://10.0.0.1:80"), `routes.yaml: routes[0] (/api): targets: must be a list of at least one {url, weight} entry, not "http://10.0.0.1:80"`, "targets"},
		{"entry a string", route(api + `, targets: ["http://10.0.0.1:80"]`), `routes.yaml: routes[0] (/api): targets[0]: must be a mapping such as {url: "http://10.0.0.1:80", weight: 1}, not a string`, "targets[0]"},
		{"entry without url", route(api + `, targets: [{url: "http://10.0.0.1:80"}, {weight: 2}]`), "routes.yaml: routes[0] (/api): targets[1].url: is required (http://host:port or https://host:port)", "targets[1].url"},
		{"entry bad url", route(api + `, targets: [{url: "http://10.0.0.1"}]`), `routes.yaml: routes[0] (/api): targets[0].url: "http://10.0.0.1" must have an explicit port, as in http://10.0.0.1:80`, "targets[0].url"},
		{"entry unknown key", route(api + `, targets: [{url: "http://10.0.0.1:80", wieght: 2}]`), "routes.yaml: routes[0] (/api): targets[0].wieght: unknown key (did you mean weight?)", "targets[0].wieght"},
		{"weight zero", route(api + `, targets: [{url: "http://10.0.0.1:80", weight: 0}]`), "routes.yaml: routes[0] (/api): targets[0].weight: must be between 1 and 100, not 0", "targets[0].weight"},
		{"weight too high", route(api + `, targets: [{url: "http://10.0.0.1:80", weight: 101}]`), "routes.yaml: routes[0] (/api): targets[0].weight: must be between 1 and 100, not 101", "targets[0].weight"},
		{"weight not int", route(api + `, targets: [{url: "http://10.0.0.1:80", weight: heavy}]`), `routes.yaml: routes[0] (/api): targets[0].weight: must be an integer, not "heavy"`, "targets[0].weight"},
		{"duplicate host:port", route(api + `, targets: [{url: "http://10.0.0.1:80"}, {url: "http://10.0.0.1:80", weight: 2}]`),
			"routes.yaml: routes[0] (/api): targets: targets[0] and targets[1] are both 10.0.0.1:80: each host:port once (raise its weight instead)", "targets"},
		{"duplicate host in other case", route(api + `, targets: [{url: "http://api.internal:80"}, {url: "http://API.internal:80"}]`),
			"routes.yaml: routes[0] (/api): targets: targets[0] and targets[1] are both api.internal:80: each host:port once (raise its weight instead)", "targets"},
		{"mixed schemes", route(api + `, targets: [{url: "http://10.0.0.1:80"}, {url: "https://10.0.0.2:443"}]`),
			"routes.yaml: routes[0] (/api): targets: targets[1] is https but targets[0] is http: all targets of a route share one scheme", "targets"},
		{"unknown balance", route(api + ", " + tg + ", balance: least_conn"), `routes.yaml: routes[0] (/api): balance: must be p2c, least_request, round_robin or client_ip_hash, not "least_conn"`, "balance"},
		{"retries too high", route(api + ", " + tg + ", retries: 4"), "routes.yaml: routes[0] (/api): retries: must be between 0 and 3, not 4", "retries"},
		{"retries negative", route(api + ", " + tg + ", retries: -1"), "routes.yaml: routes[0] (/api): retries: must be between 0 and 3, not -1", "retries"},
		{"passive not a mapping", route(api + ", " + tg + ", passive_health: true"), "routes.yaml: routes[0] (/api): passive_health: must be a mapping of consecutive_failures, eject_time, max_eject_time, max_ejected_percent, not the boolean true", "passive_health"},
		{"passive unknown key", route(api + ", " + tg + ", passive_health: {eject_tme: 5s}"), "routes.yaml: routes[0] (/api): passive_health.eject_tme: unknown key (did you mean eject_time?)", "passive_health.eject_tme"},
		{"passive bad duration", route(api + ", " + tg + ", passive_health: {eject_time: 30}"), `routes.yaml: routes[0] (/api): passive_health.eject_time: 30 has no unit: write a Go duration such as "5s" or "1m30s"`, "passive_health.eject_time"},
		{"passive negative failures", route(api + ", " + tg + ", passive_health: {consecutive_failures: -1}"), "routes.yaml: routes[0] (/api): passive_health: consecutive_failures must not be negative, not -1 (0 turns passive health off)", "passive_health"},
		{"passive zero eject time", route(api + ", " + tg + ", passive_health: {eject_time: 0s}"), "routes.yaml: routes[0] (/api): passive_health: eject_time must be greater than 0, not 0s (set consecutive_failures: 0 to turn passive health off)", "passive_health"},
		{"passive cap below eject", route(api + ", " + tg + ", passive_health: {eject_time: 1m, max_eject_time: 30s}"), "routes.yaml: routes[0] (/api): passive_health: max_eject_time 30s must be at least eject_time 1m", "passive_health"},
		{"passive percent", route(api + ", " + tg + ", passive_health: {max_ejected_percent: 101}"), "routes.yaml: routes[0] (/api): passive_health: max_ejected_percent must be between 0 and 100, not 101", "passive_health"},
		{"health check without path", route(api + ", " + tg + ", health_check: {interval: 5s}"), "routes.yaml: routes[0] (/api): health_check.path: is required when health_check is present (a path such as /healthz)", "health_check.path"},
		{"health check empty", route(api + ", " + tg + ", health_check: {}"), "routes.yaml: routes[0] (/api): health_check.path: is required when health_check is present (a path such as /healthz)", "health_check.path"},
		{"health check relative path", route(api + ", " + tg + ", health_check: {path: healthz}"), `routes.yaml: routes[0] (/api): health_check: path must start with /, not "healthz"`, "health_check"},
		{"health check zero interval", route(api + ", " + tg + ", health_check: {path: /h, interval: 0s}"), "routes.yaml: routes[0] (/api): health_check: interval must be greater than 0, not 0s", "health_check"},
		{"health check negative timeout", route(api + ", " + tg + ", health_check: {path: /h, timeout: -1s}"), "routes.yaml: routes[0] (/api): health_check: timeout must be greater than 0, not -1s", "health_check"},
		{"health check zero threshold", route(api + ", " + tg + ", health_check: {path: /h, healthy_threshold: 0}"), "routes.yaml: routes[0] (/api): health_check: healthy_threshold and unhealthy_threshold must be at least 1, not 0 and 3", "health_check"},
		{"typo of targets", route(api + `, target: "http://10.0.0.1:80", tragets: [{url: "http://10.0.0.2:80"}]`), "routes.yaml: routes[0] (/api): tragets: unknown key (did you mean targets?)", "tragets"},
		{"discover not dns", route(api + `, targets: [{url: "http://api.svc:80", discover: srv}]`), `routes.yaml: routes[0] (/api): targets[0].discover: must be dns (one target per address of the name), not "srv"`, "targets[0].discover"},
		{"latency_decay too short", route(api + ", " + tg + ", latency_decay: 500ms"), "routes.yaml: routes[0] (/api): latency_decay: must be between 1s and 5m, not 500ms", "latency_decay"},
		{"latency_decay too long", route(api + ", " + tg + ", latency_decay: 6m"), "routes.yaml: routes[0] (/api): latency_decay: must be between 1s and 5m, not 6m", "latency_decay"},
		{"discovery_refresh too short", route(api + ", " + tg + ", discovery_refresh: 100ms"), "routes.yaml: routes[0] (/api): discovery_refresh: must be between 1s and 5m, not 100ms", "discovery_refresh"},
		{"discovery_refresh too long", route(api + ", " + tg + ", discovery_refresh: 1h"), "routes.yaml: routes[0] (/api): discovery_refresh: must be between 1s and 5m, not 1h", "discovery_refresh"},
		{"health check unknown key", route(api + ", " + tg + ", health_check: {path: /h, intervall: 5s}"), "routes.yaml: routes[0] (/api): health_check.intervall: unknown key (did you mean interval?)", "health_check.intervall"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := loadStrings("", c.routes)
			errs := configErrors(t, err)
			if len(errs) != 1 {
				t.Fatalf("want exactly one error, got %d: %v", len(errs), err)
			}
			e := errs[0]
			if e.Error() != c.want || e.Key != c.key || e.Route != 0 || e.File != "routes.yaml" || e.Prefix != "/api" {
				t.Errorf("error\n got %q (key %q)\nwant %q (key %q)", e.Error(), e.Key, c.want, c.key)
			}
		})
	}
}

func TestTargetsCheckJSON(t *testing.T) {
	t.Parallel()
	cfg := mustLoad(t, "", poolRoute(twoTargets+"    balance: round_robin\n    health_check: {path: /healthz}\n"))
	out, err := cfg.CheckJSON()
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Routes []struct {
			Effective struct {
				Targets       []EffectiveTarget `json:"targets"`
				Balance       string            `json:"balance"`
				PassiveHealth map[string]any    `json:"passive_health"`
				HealthCheck   map[string]any    `json:"health_check"`
				Retries       int               `json:"retries"`
			} `json:"effective"`
		} `json:"routes"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("-check output is not JSON: %v\n%s", err, out)
	}
	e := doc.Routes[0].Effective
	if len(e.Targets) != 2 || e.Targets[0].Weight != 3 || e.Balance != "round_robin" || e.Retries != 1 {
		t.Errorf("-check pool: %+v", e)
	}
	if e.PassiveHealth["eject_time"] != "30s" || e.PassiveHealth["max_eject_time"] != "5m" || e.PassiveHealth["consecutive_failures"] != 5.0 {
		t.Errorf("-check passive_health: %v", e.PassiveHealth)
	}
	if e.HealthCheck["path"] != "/healthz" || e.HealthCheck["interval"] != "10s" || e.HealthCheck["timeout"] != "2s" || e.HealthCheck["healthy_threshold"] != 2.0 {
		t.Errorf("-check health_check: %v", e.HealthCheck)
	}
	none := mustLoad(t, "", okRoute)
	out, _ = none.CheckJSON()
	if !strings.Contains(string(out), `"health_check": null`) {
		t.Errorf("a route without checks must show health_check null:\n%s", out)
	}
}

func TestTargetsDiscoveryAndLatencyKeys(t *testing.T) {
	t.Parallel()
	cfg := mustLoad(t, "", poolRoute(`    targets:
      - {url: "http://api.prod.svc.cluster.local:8080", discover: dns, weight: 2}
      - {url: "http://10.0.0.1:8080"}
    balance: least_request
    retries: 3
`))
	e := cfg.Routes[0].Effective
	want := []EffectiveTarget{
		{URL: "http://api.prod.svc.cluster.local:8080", Addr: "api.prod.svc.cluster.local:8080", Weight: 2, Discover: "dns"},
		{URL: "http://10.0.0.1:8080", Addr: "10.0.0.1:8080", Weight: 1},
	}
	if !reflect.DeepEqual(e.Targets, want) {
		t.Errorf("targets %+v, want %+v", e.Targets, want)
	}
	// Retries are not capped by the configured entries: a name stands for any number.
	if e.Balance != "least_request" || e.LatencyDecay != 10*time.Second || e.DiscoveryRefresh != 5*time.Second || e.Retries != 3 {
		t.Errorf("balance %q decay %v refresh %v retries %d", e.Balance, e.LatencyDecay, e.DiscoveryRefresh, e.Retries)
	}
	cfg = mustLoad(t, "", poolRoute(twoTargets+"    latency_decay: 30s\n    discovery_refresh: 2s\n"))
	if e := cfg.Routes[0].Effective; e.LatencyDecay != 30*time.Second || e.DiscoveryRefresh != 0 {
		t.Errorf("decay %v, refresh %v (0 without a discovered entry)", e.LatencyDecay, e.DiscoveryRefresh)
	}
	cfg = mustLoad(t, "server:\n  resolver: \"10.96.0.10:53\"\n", okRoute)
	if cfg.Server.Resolver != "10.96.0.10:53" {
		t.Errorf("server.resolver %q", cfg.Server.Resolver)
	}
	for _, bad := range []string{"10.96.0.10", ":53", "dns:0", "dns:http"} {
		_, err := loadStrings("server:\n  resolver: \""+bad+"\"\n", okRoute)
		errs := configErrors(t, err)
		if len(errs) != 1 || errs[0].Key != "server.resolver" || !strings.Contains(errs[0].Error(), "host:port of a DNS server") {
			t.Errorf("resolver %q: %v", bad, err)
		}
	}
}

// FuzzTargets feeds arbitrary pool keys to the loader: it must never panic, every error must
// be a *conf.Error naming the route, and an accepted route has targets that upstream accepts
// (weights 1..100, host:port unique, at least one).
func FuzzTargets(f *testing.F) {
	f.Add(twoTargets + "    balance: round_robin\n")
	f.Add("    targets: [{url: \"http://a:1\", weight: 100}, {url: \"http://A:1\"}]\n")
	f.Add("    targets: [\"http://a:1\"]\n    passive_health: {eject_time: 0s}\n")
	f.Add("    target: \"http://a:1\"\n    health_check: {path: /h, interval: -1s}\n    retries: 9\n")
	f.Add("    targets: {url: x}\n    health_check: []\n")
	f.Fuzz(func(t *testing.T, keys string) {
		cfg, err := loadStrings("", poolRoute(keys))
		if err != nil {
			for _, e := range configErrors(t, err) {
				if e.Error() == "" {
					t.Fatal("empty error")
				}
			}
			return
		}
		for _, r := range cfg.Routes {
			e := r.Effective
			if len(e.Targets) == 0 || r.Target == "" {
				t.Fatalf("accepted route without targets: %+v", r)
			}
			seen := map[string]bool{}
			for _, tg := range e.Targets {
				if tg.Weight < MinTargetWeight || tg.Weight > MaxTargetWeight || seen[tg.Addr] || tg.Addr == "" {
					t.Fatalf("accepted target %+v", tg)
				}
				seen[tg.Addr] = true
			}
			if e.Retries < 0 || e.Retries > MaxRetries || (e.HealthCheck != nil && e.HealthCheck.Path == "") {
				t.Fatalf("accepted effective %+v", e)
			}
		}
	})
}
