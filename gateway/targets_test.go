package gateway

import (
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"toron/conf"
	up "toron/upstream"
)

func TestUpstreamConfigFromRoute(t *testing.T) {
	cfg, err := conf.LoadBytes("config.yaml", nil, "routes.yaml", []byte(`routes:
  - type: upstream
    name: api
    prefix: /api
    targets:
      - {url: "http://127.0.0.1:1", weight: 3}
      - {url: "http://127.0.0.1:2"}
    balance: round_robin
    retries: 2
    passive_health: {consecutive_failures: 2}
    health_check: {path: /healthz, interval: 1m}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	var r up.Resolver
	ucfg := upstreamConfig(&cfg.Routes[0], metrics.NewSet(), r.Dial, nil, nil, nil, nil)
	if ucfg.Route != "api" || ucfg.Balance != up.RoundRobin || ucfg.Retries != 1 || len(ucfg.Targets) != 2 ||
		ucfg.Targets[0] != (up.TargetConfig{Addr: "127.0.0.1:1", Weight: 3}) {
		t.Errorf("config %+v", ucfg)
	}
	if p := ucfg.Passive; p.ConsecutiveFailures != 2 || p.EjectTime != 30*time.Second || p.MaxEjectedPercent != 50 {
		t.Errorf("passive %+v", p)
	}
	if c := ucfg.Check; c == nil || c.Path != "/healthz" || c.Interval != time.Minute || c.Timeout != 2*time.Second || c.Dial == nil {
		t.Errorf("check %+v", c)
	}
	s, err := up.NewSet(ucfg, nil)
	if err != nil {
		t.Fatalf("a validated route must build its Set: %v", err)
	}
	s.Close()
}

func TestLogUpstreamEvent(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	logf := logUpstreamEvent(zap.New(core))
	logf(up.Event{Kind: up.EventEjected, Route: "api", Target: "10.0.0.1:80", For: 30 * time.Second})
	logf(up.Event{Kind: up.EventPanic, Route: "api"})
	entries := logs.All()
	if len(entries) != 2 || !strings.Contains(entries[0].Message, "ejected") || entries[0].ContextMap()["target"] != "10.0.0.1:80" ||
		entries[1].Level != zap.ErrorLevel || entries[1].ContextMap()["route"] != "api" {
		t.Fatalf("logged %+v", entries)
	}
}
