// This file owns the turning of a validated route into what package upstream takes: the
// options of its Set, the params of each target's pool, its upstream TLS configuration.
package gateway

import (
	"crypto/tls"
	"net"
	"strings"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/zap"

	"toron/conf"
	up "toron/upstream"
)

// The package is imported as up: the gateway's tests have a type named upstream.

// upstreamConfig turns a validated route into the options of its up.Set (SPEC 13):
// targets with weights, balance, passive health, active checks and retries. dial is how the
// route reaches a target (the shared *up.Resolver's Dial: DNS at dial time, cached at
// most 30 s), used by the checks as by requests; upstreamTLS is the route's upstream TLS
// settings for https:// targets, nil for http://. onEvent logs the health changes (see
// logUpstreamEvent). buildSnapshot calls it for every route it builds a Set for.
//
// lookup resolves the route's discover: dns entries (server.resolver); onTarget attaches the
// pool of every target the Set adds, at NewSet and when discovery finds an address.
func upstreamConfig(r *conf.Route, set *metrics.Set, dial up.DialFunc, upstreamTLS *tls.Config, onEvent func(up.Event), lookup up.LookupFunc, onTarget func(*up.Target)) up.Config {
	e := &r.Effective
	cfg := up.Config{
		Route:            r.Name,
		Retries:          e.Retries,
		Metrics:          set,
		OnEvent:          onEvent,
		LatencyDecay:     e.LatencyDecay,
		DiscoveryRefresh: e.DiscoveryRefresh,
		Lookup:           lookup,
		OnTarget:         onTarget,
		Passive: up.PassiveConfig{
			ConsecutiveFailures: e.PassiveHealth.ConsecutiveFailures,
			EjectTime:           e.PassiveHealth.EjectTime,
			MaxEjectTime:        e.PassiveHealth.MaxEjectTime,
			MaxEjectedPercent:   e.PassiveHealth.MaxEjectedPercent,
		},
	}
	for _, t := range e.Targets {
		cfg.Targets = append(cfg.Targets, up.TargetConfig{Addr: t.Addr, Weight: t.Weight, Discover: t.Discover == conf.DiscoverDNS})
	}
	// conf accepted only these four spellings.
	cfg.Balance, _ = up.ParseBalance(e.Balance)
	if h := e.HealthCheck; h != nil {
		cfg.Check = &up.CheckConfig{
			Path:               h.Path,
			Interval:           h.Interval,
			Timeout:            h.Timeout,
			HealthyThreshold:   h.HealthyThreshold,
			UnhealthyThreshold: h.UnhealthyThreshold,
			Dial:               dial,
			TLS:                upstreamTLS,
		}
	}
	return cfg
}

// logUpstreamEvent logs a route's health changes: an ejection, a target going down or up,
// and a panic episode once at its start and once at its end (SPEC 13).
func logUpstreamEvent(log *zap.Logger) func(up.Event) {
	return func(ev up.Event) {
		fields := []zap.Field{zap.String("route", ev.Route), zap.String("event", ev.Kind.String())}
		if ev.Target != "" {
			fields = append(fields, zap.String("target", ev.Target))
		}
		switch ev.Kind {
		case up.EventEjected:
			log.Warn("upstream target ejected", append(fields, zap.Duration("for", ev.For))...)
		case up.EventDown:
			log.Warn("upstream target down (active checks)", fields...)
		case up.EventUp:
			log.Info("upstream target up (active checks)", fields...)
		case up.EventPanic:
			log.Error("no eligible upstream target: panic mode, every target is used", fields...)
		case up.EventPanicOver:
			log.Info("an upstream target is eligible again: panic mode over", fields...)
		}
	}
}

// targetPoolParams returns the params of target t's pool on route r: its address, and its TLS
// configuration verified under the route's tls_server_name, else the target's own name (the
// entry's host for a discovered address, SPEC 13).
func targetPoolParams(r *conf.Route, s *conf.Server, routeTLS *tls.Config, t *up.Target) up.PoolParams {
	return poolParamsOf(r, s, t.Addr(), up.TargetTLS(routeTLS, r.TLSServerName, net.JoinHostPort(t.ServerName(), "0")))
}

// poolParamsOf returns the params of the pool of target addr of route r; tlsCfg is the
// target's upstream TLS configuration (nil for http targets).
func poolParamsOf(r *conf.Route, s *conf.Server, addr string, tlsCfg *tls.Config) up.PoolParams {
	return up.PoolParams{
		Addr:     addr,
		HTTPS:    strings.HasPrefix(r.Target, "https://"),
		TLS:      tlsCfg,
		MaxConns: r.Effective.MaxUpstreamConns,
		Connect:  r.Effective.ConnectTimeout,
		Header:   r.Effective.ResponseHeaderTimeout,
		Write:    r.Effective.WriteTimeout,
		Idle:     s.UpstreamIdleTimeout,
	}
}

// upstreamTLSConfig builds the client TLS configuration of route r's https:// target
// (up.TLSConfig); nil for an http:// target.
func upstreamTLSConfig(r *conf.Route) (*tls.Config, error) {
	return up.TLSConfig(up.TLSOptions{
		Route:              r.Name,
		Target:             r.Target,
		ServerName:         r.TLSServerName,
		RootCAs:            r.TLSRootCAs,
		InsecureSkipVerify: r.TLSInsecureSkipVerify,
	})
}
